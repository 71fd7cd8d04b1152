"""The console's safety pieces on their own: session cookies (signed, server-side, revocable; a
forged one costs no store access), the login throttle, Host parsing and the allow-list, the
Origin check, local paths, and the payload printer at any depth."""
from __future__ import annotations

import json

import msgpack
import pytest

from scheduler.shell.ui.hosts import HostPolicy, parse_host
from scheduler.shell.ui.params import BadRequest, local_path, whole_number
from scheduler.shell.ui.payload import payload_text
from scheduler.shell.ui.security import SESSION_SECONDS, ConsoleAuth, same_origin
from scheduler.shell.ui.throttle import LoginThrottle, client_key


class Store:
    """A session store in a dict that counts every access (the Redis one is tested in integration)."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}
        self.accesses = 0

    def create(self, name: str, record: bytes, ttl_ms: int) -> None:
        self.accesses += 1
        self.records[name] = record

    def read(self, name: str) -> bytes | None:
        self.accesses += 1
        return self.records.get(name)

    def delete(self, name: str) -> None:
        self.accesses += 1
        self.records.pop(name, None)


def test_a_session_names_its_operator_until_it_ends_and_nobody_after() -> None:
    now = [1_800_000_000.0]
    auth = ConsoleAuth("operator-token", Store(), clock=lambda: now[0])
    cookie, _ = auth.login("alice", "127.0.0.1")
    assert (s := auth.session(cookie)) is not None and s.who == "alice"
    now[0] += SESSION_SECONDS - 1
    assert auth.session(cookie) is not None
    now[0] += 1
    assert auth.session(cookie) is None, "a session acts no more once it has ended"


def test_a_logged_out_session_names_nobody_and_the_store_keeps_no_cookie() -> None:
    store = Store()
    auth = ConsoleAuth("operator-token", store)
    cookie, session = auth.login("alice", "127.0.0.1")
    other, _ = auth.login("bob", "127.0.0.1")
    sid = cookie.split(".")[0]
    assert not any(sid in name or sid.encode() in rec for name, rec in store.records.items()), \
        "the store holds an HMAC of the id, not the id"
    auth.logout(session)
    assert auth.session(cookie) is None, "replaying the cookie after logout"
    assert auth.session(other) is not None, "another session is not touched"


def test_a_forged_or_altered_cookie_is_refused_without_touching_the_store() -> None:
    store = Store()
    auth = ConsoleAuth("operator-token", store)
    cookie, _ = auth.login("alice", "127.0.0.1")
    sid, mac = cookie.split(".")
    before = store.accesses
    altered = sid[:-1] + ("B" if sid.endswith("A") else "A")  # one character of the id changed
    for forged in (f"{altered}.{mac}", f"{sid}.{'0' * 64}", sid, f"{sid}.{mac}.x", "", None, "é." + mac,
                   "a" * 5000, f"x.{sid}.{mac}"):
        assert auth.session(forged) is None, forged
    assert store.accesses == before, "a bad signature is refused before any store access"
    assert ConsoleAuth("another-token", store).session(cookie) is None, "a restart with a new token ends every session"


def test_csrf_tokens_and_flash_signatures_belong_to_their_session_and_token() -> None:
    auth = ConsoleAuth("operator-token", Store())
    _, a = auth.login("alice", "x")
    _, b = auth.login("bob", "x")
    assert auth.csrf_ok(a, auth.csrf_for(a)) and not auth.csrf_ok(b, auth.csrf_for(a))
    assert not auth.csrf_ok(a, "é" * 64) and not auth.csrf_ok(a, "")
    assert auth.signed("job x cancelled", auth.sign("job x cancelled"))
    assert not auth.signed("log in at evil.example", auth.sign("job x cancelled"))
    assert not ConsoleAuth("another-token", Store()).signed("m", auth.sign("m"))
    assert auth.token_ok("operator-token") and not auth.token_ok("operator-toke") and not auth.token_ok("é")


def test_failed_logins_lock_an_address_out_for_longer_each_time_and_memory_stays_bounded() -> None:
    now = [0.0]
    t = LoginThrottle(clock=lambda: now[0], free=3, first_lock=1.0, max_lock=8.0, forget=100.0, max_addresses=50)
    for i in range(3):
        assert t.failed("10.0.0.1") == (i + 1, 0.0), "the first failures are free"
    assert t.retry_after("10.0.0.1") == 0
    locks = [t.failed("10.0.0.1")[1] for _ in range(6)]
    assert locks == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0], "doubling up to the cap"
    assert t.retry_after("10.0.0.1") == 8.0 and t.retry_after("10.0.0.2") == 0, "per address"
    assert t.first_refusal("10.0.0.1") and not t.first_refusal("10.0.0.1"), "audited once per lock"
    now[0] += 8.0
    assert t.retry_after("10.0.0.1") == 0
    t.succeeded("10.0.0.1")
    assert t.failed("10.0.0.1") == (1, 0.0), "a correct token clears the address"
    for i in range(1000):
        t.failed(f"10.1.{i // 256}.{i % 256}")
    assert len(t) == 50, "at most max_addresses remembered"
    now[0] += 100.0
    assert t.failed("10.1.3.231") == (1, 0.0), "forgotten after a quiet period"
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1:8089", True), ("localhost:8089", True), ("LOCALHOST:8089", True), ("localhost.:8089", True),
    ("[::1]:8089", True), ("[0:0:0:0:0:0:0:1]:8089", True), ("10.1.2.3:8089", True),
    ("console.example.com", True), ("Console.Example.COM.:443", True), ("proxy.example:9000", True),
    ("attacker.example:8089", False), ("attacker.example", False), ("localhost:8090", False),
    ("localhost", False), ("127.0.0.1", False), ("proxy.example:9001", False),
    ("localhost.attacker.example:8089", False),
    ("127.0.0.1.attacker.example:8089", False), ("127.1:8089", False), ("::1:8089", False), ("", False),
    ("[::1:8089", False), ("local host:8089", False), ("localhost:80890", False), ("user@localhost:8089", False),
])
def test_the_host_allow_list(host: str, ok: bool) -> None:
    policy = HostPolicy(["console.example.com", "proxy.example:9000"])
    refused = policy.refusal([host], "http", 8089)
    assert (refused is None) is ok, refused
    assert policy.refusal([], "http", 8089) is not None and policy.refusal([host, host], "http", 8089) is not None


def test_a_host_without_a_port_means_the_schemes_default_port() -> None:
    assert HostPolicy().refusal(["localhost"], "http", 80) is None
    assert HostPolicy().refusal(["localhost"], "https", 443) is None
    assert HostPolicy().refusal(["localhost"], "https", 80) is not None
    assert parse_host("[::1]") == ("::1", None) and parse_host("LocalHost.:1") == ("localhost", 1)
    with pytest.raises(ValueError, match="brackets"):
        parse_host("::1")


def test_the_origin_check_compares_scheme_host_and_port() -> None:
    assert same_origin("http://127.0.0.1:8089", None, "http", "127.0.0.1:8089")
    assert same_origin("https://console.example.com", None, "https", "console.example.com:443")
    assert same_origin(None, "http://localhost:8089/dead?x=1", "http", "localhost:8089")
    assert same_origin(None, None, "http", "localhost:8089"), "not a browser: the CSRF token decides"
    assert not same_origin("http://console.example.com", None, "https", "console.example.com"), "scheme"
    assert not same_origin("http://evil.example:8089", None, "http", "127.0.0.1:8089")
    assert not same_origin("null", None, "http", "127.0.0.1:8089")
    assert not same_origin("http://127.0.0.1:8090", None, "http", "127.0.0.1:8089")


def test_only_paths_on_the_console_are_followed_after_a_login_or_an_action() -> None:
    assert local_path("/dead?queue=q") == "/dead?queue=q"
    for bad in ("//evil.example", "/\\evil.example", "/\\/evil.example", "https://evil.example", "dead",
                "/x\r\nSet-Cookie: a=b", ""):
        assert local_path(bad) is None, bad


def test_numbers_in_the_query_say_what_they_accept() -> None:
    assert whole_number("limit", "500", 1, 500) == 500
    for bad in ("-5", "abc", "0", str(10**9), "1e3", " 5", "٣"):
        with pytest.raises(BadRequest, match="limit must be a whole number from 1 to 500"):
            whole_number("limit", bad, 1, 500)


def test_payloads_print_like_indented_json_and_deep_ones_without_recursion() -> None:
    doc = {"a": [1, {"b": None, "c": []}], "é": "<x>", "f": 1.5}
    assert payload_text(doc) == json.dumps(doc, indent=2, ensure_ascii=False)
    deep: list[object] = []
    for _ in range(5000):
        deep = [deep]
    text = payload_text(deep)
    assert text.count("[") == text.count("]") == 5001 and len(text) < 60_000, "compact below the pretty depth"
    assert "".join(text.split()) == "[" * 5001 + "]" * 5001
    odd = {1: b"\x00\xff", None: [msgpack.ExtType(5, b"ab")], b"k": 2**64 - 1, 2.5: float("inf")}
    assert payload_text(odd, pretty_depth=0) == ('{"1": "hex:00ff", "null": ["ext(5, hex:6162)"], '
                                                 '"hex:6b": 18446744073709551615, "2.5": Infinity}')
