"""The console's session cookies: signed with the operator token, naming who acts and when the
session ends; forged, altered or ended sessions name nobody."""
from __future__ import annotations

from scheduler.shell.ui.security import SESSION_SECONDS, ConsoleAuth


def test_a_session_names_its_operator_until_it_ends_and_nobody_after() -> None:
    now = [1_800_000_000.0]
    auth = ConsoleAuth("operator-token", clock=lambda: now[0])
    cookie = auth.session_for("alice")
    assert auth.who(cookie) == "alice"
    now[0] += SESSION_SECONDS - 1
    assert auth.who(cookie) == "alice"
    now[0] += 1
    assert auth.who(cookie) is None, "a session acts no more once it has ended"


def test_an_altered_or_foreign_session_names_nobody() -> None:
    auth = ConsoleAuth("operator-token", clock=lambda: 1_800_000_000.0)
    cookie = auth.session_for("alice")
    name, ends, mac = cookie.split(".")
    assert auth.who(f"{name}.{int(ends) + 86400}.{mac}") is None, "a later end needs a new signature"
    assert auth.who(f"Ym9i.{ends}.{mac}") is None, "another name needs a new signature"
    assert auth.who(f"{name}.{mac}") is None and auth.who("") is None and auth.who(None) is None
    assert ConsoleAuth("another-token").who(cookie) is None, "a restart with a new token ends every session"
