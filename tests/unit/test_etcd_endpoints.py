"""etcd endpoint lists: what is accepted, and a malformed list refused with a ConfigError that says
what is wrong and what is expected, without the password (the CLI's exit 2 is in
tests/integration/test_etcd_endpoint_input.py)."""
from __future__ import annotations

import pytest

from scheduler.protocol import config
from scheduler.protocol.errors import ConfigError
from scheduler.protocol.etcd_endpoints import check_etcd_endpoints, parse_endpoints

PW = "Pw-etcd-9q2x"


@pytest.mark.parametrize("value, why", [
    ("garbage://", "the scheme must be http:// or https://"),
    ("http://", "no host"),
    (":2379", "no host"),
    ("host:notaport", "the port is not a number"),
    ("http://h:99999", "the port is not a number"),
    ("http://h:0", "the port is not a number"),
    ("", "no etcd endpoints given"),
    (" , ", "no etcd endpoints given"),
    ("http://h:2379/v3", "a path, query or fragment"),
    ("[::1]:2379", "IPv6"),
    ("http://a:2379,https://b:2379", "mix http:// and https://"),
    (f"http://root:{PW}@h:x", "the port is not a number"),
    (f"ftp://root:{PW}@127.0.0.1:2379", "the scheme must be"),
    (f"root:{PW}@127.0.0.1:xx", "the port is not a number"),
    (f"{PW}@127.0.0.1:xx", "the port is not a number"),
    (f"http://{PW}@127.0.0.1:2379", "credentials must be user:password@ (both)"),
    (f"http://:{PW}@127.0.0.1:2379", "credentials must be user:password@ (both)"),
    (f"http://root:{PW}@a:2379,http://root:other@b:2379", "different user:password@ credentials"),
    (f"http://root:{PW} x@127.0.0.1:2379", "contains whitespace"),
])
def test_a_malformed_list_is_refused_saying_why_and_what_is_expected(value: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_etcd_endpoints(value)
    msg = str(err.value)
    assert why in msg and "expected [http[s]://][user:password@]host[:port]" in msg and "--etcd" in msg, msg
    assert "9q2x" not in msg, msg
    assert "\n" not in msg


def test_members_scheme_and_credentials_are_parsed() -> None:
    p = parse_endpoints(f"http://root:{PW.replace('-', '%2D')}@localhost:2379, http://127.0.0.1:22379")
    assert [str(e) for e in p.endpoints] == ["127.0.0.1:2379", "127.0.0.1:22379"]
    assert (p.tls, p.user, p.password) == (False, "root", PW)
    p = parse_endpoints(["https://etcd.example", "https://etcd2.example:12379"])
    assert [str(e) for e in p.endpoints] == ["etcd.example:2379", "etcd2.example:12379"] and p.tls
    assert parse_endpoints(f"http://root:{PW}@a:2379,b:2379").password == PW  # credentials on the first only


def test_config_checks_the_argument_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZSCHED_ETCD_ENDPOINTS", raising=False)
    assert config.optional_etcd_endpoints(None) is None
    assert config.etcd_endpoints(None) == config.DEFAULT_ETCD_ENDPOINTS
    monkeypatch.setenv("ZSCHED_ETCD_ENDPOINTS", "garbage://")
    for read in (config.optional_etcd_endpoints, config.etcd_endpoints):
        with pytest.raises(ConfigError, match="scheme must be"):
            read(None)
        assert read("127.0.0.1:2379") == "127.0.0.1:2379"  # the argument wins
        with pytest.raises(ConfigError, match="no etcd endpoints given"):
            read("")  # an empty argument is refused, not taken as "unset"
    monkeypatch.setenv("ZSCHED_ETCD_ENDPOINTS", "")
    assert config.optional_etcd_endpoints(None) is None  # an empty variable is unset
