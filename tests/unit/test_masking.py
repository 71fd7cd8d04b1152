"""mask_secrets: every password in a URL, an etcd endpoint list or a message is hidden, in every
form an operator may write it (percent-encoded or not); what is not a secret stays readable."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from scheduler.protocol.masking import mask_secrets


@pytest.mark.parametrize("text, masked", [
    # Redis URLs, every scheme
    ("redis://u:pw@h:1/0", "redis://u:***@h:1/0"),
    ("redis://:pw@h:1/0", "redis://***@h:1/0"),
    ("redis://pw@h:1/0", "redis://***@h:1/0"),  # user info without ":" may be a password
    ("redis://h:1/0?password=pw&db=0", "redis://h:1/0?password=***&db=0"),
    ("redis+sentinel://u:pw@a:1,b:2/m?sentinel_password=x", "redis+sentinel://u:***@a:1,b:2/m?sentinel_password=***"),
    ("rediss+cluster://app:pw@127.0.0.1:7000,[::1]:7001", "rediss+cluster://app:***@127.0.0.1:7000,[::1]:7001"),
    ("unix://u:pw@/tmp/redis.sock?db=0", "unix://u:***@/tmp/redis.sock?db=0"),
    ("redis://h:1/0", "redis://h:1/0"),
    # TLS file paths are not secrets; a key's passphrase is
    ("rediss://u:pw@h:1/0?ssl_keyfile=/etc/zs/secret-key.pem&ssl_password=kp&ssl_ca_certs=/etc/zs/ca.pem",
     "rediss://u:***@h:1/0?ssl_keyfile=/etc/zs/secret-key.pem&ssl_password=***&ssl_ca_certs=/etc/zs/ca.pem"),
    # etcd endpoint lists, with and without schemes
    ("http://root:pw@127.0.0.1:2379", "http://root:***@127.0.0.1:2379"),
    ("http://root:pw@h1:2379,http://root:pw@h2:2379", "http://root:***@h1:2379,http://root:***@h2:2379"),
    ("root:pw@127.0.0.1:2379,root:pw@127.0.0.1:22379", "root:***@127.0.0.1:2379,root:***@127.0.0.1:22379"),
    ("root:pw@h1:2379, 127.0.0.1:22379", "root:***@h1:2379, 127.0.0.1:22379"),
    ("pw@127.0.0.1:2379", "***@127.0.0.1:2379"),
    ("127.0.0.1:2379,127.0.0.1:22379", "127.0.0.1:2379,127.0.0.1:22379"),
    # passwords written without percent-encoding: hidden up to the last @ of their URL
    ("redis://u:p@ss@h:1/0", "redis://u:***@h:1/0"),
    ("redis://u:p/s?s#s@h:1/0", "redis://u:***@h:1/0"),
    ("http://root:a,b@h:2379", "http://root:***@h:2379"),
    ("root:a,b@h:2379", "root:***@h:2379"),
    ("redis://h:1/0?password=a&b&db=0", "redis://h:1/0?password=***&db=0"),
    ("redis://u:p%40ss@h:1/0", "redis://u:***@h:1/0"),
    # inside messages and log lines
    ("cannot reach etcd at http://root:pw@127.0.0.1:1: unavailable; retrying in 0.1s",
     "cannot reach etcd at http://root:***@127.0.0.1:1: unavailable; retrying in 0.1s"),
    ("etcd endpoint 'root:pw@h:x' is invalid", "etcd endpoint 'root:***@h:x' is invalid"),
    ("export ZSCHED_ETCD_ENDPOINTS=root:pw@h:2379 ZSCHED_UI_TOKEN=tok",
     "export ZSCHED_ETCD_ENDPOINTS=root:***@h:2379 ZSCHED_UI_TOKEN=***"),
    ("line one\nredis://u:pw@h:1/0\tand more", "line one\nredis://u:***@h:1/0\tand more"),
    ("at redis://h:1/0?password=***: refused", "at redis://h:1/0?password=***: refused"),
    ("redis://h:1/0?password=***xyz", "redis://h:1/0?password=***"),
])
def test_secrets_are_masked(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked
    assert mask_secrets(masked) == masked, "masking twice changes nothing more"


@pytest.mark.parametrize("text", [
    "job 42 mailed bob@example.com",  # an e-mail address is not a credential
    "expected redis://[user:password@]host:port/db or [http[s]://][user:password@]host[:port]",  # usage hints
    "fix user:password in the URL, e.g. redis://USER:PASSWORD@host:6379/0",
    "ipv4:127.0.0.1:2379: Failed to connect to remote host: Connection refused",
    "error_rate=0.5 and no password here",
])
def test_what_is_not_a_secret_stays(text: str) -> None:
    assert mask_secrets(text) == text


# Each special character an operator may leave unencoded in a password (whitespace is refused
# where URLs are read: see test_connection_urls.py and test_etcd_endpoints.py).
SPECIALS = "@:/?#,&=%'\"()[]{};!$*+<>|\\^`~"


@pytest.mark.parametrize("ch", list(SPECIALS))
def test_no_part_of_a_password_shows_whatever_it_contains(ch: str) -> None:
    pw = f"Qk{ch}x9{ch}Zz"
    forms = []
    for p in (pw, quote(pw, safe="")):
        forms += [
            f"redis://user:{p}@127.0.0.1:6379/0",
            f"redis://:{p}@127.0.0.1:6379/0",
            f"redis+sentinel://user:{p}@127.0.0.1:26379,127.0.0.1:26380/mymaster",
            f"http://root:{p}@127.0.0.1:2379,http://root:{p}@127.0.0.1:22379",
            f"root:{p}@127.0.0.1:2379,root:{p}@127.0.0.1:22379",
        ]
    forms.append(f"redis://127.0.0.1:6379/0?password={quote(pw, safe='')}&db=0")
    for form in forms:
        for text in (form, f"cannot reach Redis at {form}: refused", f"etcd endpoint {form!r} is invalid"):
            shown = mask_secrets(text)
            assert not any(part in shown for part in ("Qk", "x9", "Zz")), f"{text!r} -> {shown!r}"


# --------------------------------------------------------------- the outputs that mask everything


def test_zsched_log_lines_are_masked_tracebacks_included(capsys: pytest.CaptureFixture[str]) -> None:
    """The formatter of zsched's processes masks whatever a message (ours or a library's) quotes."""
    import logging

    from scheduler.runtime import MaskingFormatter

    logger = logging.getLogger("zsched.test-masking")
    handler = logging.StreamHandler()
    handler.setFormatter(MaskingFormatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ConnectionError("cannot use http://root:Pw-etcd-9q2x@127.0.0.1:2379")
        except ConnectionError:
            logger.exception("lost %s", "redis://app:Pw-redis-7f3k@127.0.0.1:6379/0?password=Pw-redis-7f3k")
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert "redis://app:***@127.0.0.1:6379/0?password=***" in err and "http://root:***@127.0.0.1:2379" in err
    assert "Traceback" in err and "9q2x" not in err and "7f3k" not in err, err


@pytest.mark.parametrize("debug", [False, True])
def test_zsched_tracebacks_are_masked(debug: bool, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug's traceback (exit 1, as an uncaught exception) and a known condition's under --debug
    show no password, whatever the exception quotes."""
    import argparse

    from scheduler.shell import cli

    error = RuntimeError if not debug else ValueError  # ValueError: a known condition (bad input)

    def broken(args: argparse.Namespace) -> int:
        raise error("boom at redis://app:Pw-redis-7f3k@127.0.0.1:6379/0")

    parser = cli.build_parser()
    real_parse = parser.parse_args

    def parse(argv: list[str]) -> argparse.Namespace:
        ns = real_parse(argv)
        ns.func = broken
        return ns

    monkeypatch.setattr(parser, "parse_args", parse)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    rc = cli.main([*(["--debug"] if debug else []), "queue", "list"])
    err = capsys.readouterr().err
    assert rc == (2 if debug else 1), err
    assert "Traceback" in err and "redis://app:***@127.0.0.1:6379/0" in err and "7f3k" not in err, err
