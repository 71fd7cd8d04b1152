"""Secrets kept out of every output: :func:`mask_secrets`, the one function every log line, CLI
message, console page and banner that may show a URL, an endpoint list or an error passes through.

What counts as a secret:

* the password in a URL's user info (``redis://user:PASSWORD@host``, ``http://root:PASSWORD@etcd``),
  and the whole user info when it has no ``:`` (``redis://PASSWORD@host``); user names stay;
* the same in a scheme-less etcd endpoint (``root:PASSWORD@host:2379``, ``PASSWORD@host:2379``);
* the value of any option whose name says password, secret or token (``?password=``,
  ``sentinel_password=``, ``ssl_password=``, ``token=``).

TLS file paths (``ssl_keyfile=``, ``ZSCHED_ETCD_KEY``) are not secrets: they stay, so an operator
can see which file was meant. An e-mail address (``bob@example.com``: no ``:`` before the ``@`` and
no port after the host) is not a credential and stays too, and so does the placeholder
``user:password`` of the usage hints in error messages (``expected redis://[user:password@]host``).

Users do not always percent-encode their passwords, so the password ends at the *last* ``@`` of
its URL (``redis://u:p@ss/w?rd@host`` hides ``p@ss/w?rd``), and a comma-separated list starts a
new member only after a ``,`` that follows an ``@``'s host. Too much hidden in odd cases is the
price: a password must never show, a host name may. Whitespace ends a URL, so a URL or endpoint
list with whitespace in it is refused where it is read (:func:`~scheduler.protocol.urls.check_url`,
:func:`~scheduler.protocol.etcd_endpoints.parse_endpoints`), without showing it.
"""
from __future__ import annotations

import re

MASK = "***"
"""What a secret is replaced with."""

# name=value where the name says password, secret or token; the value runs to the next
# "&name=" or whitespace, so an unencoded "&" in a password does not end it early. A value masked
# already keeps the punctuation after it ("?password=***: refused" stays as it is).
_SECRET_OPTION = re.compile(
    r"(?i)(?<![\w.\-])([\w.\-]*(?:password|passwd|secret|token)[\w.\-]*=)"
    r"(?:\*\*\*(?=[:;,.)'\"\]]*(?:\s|$))|(?:(?!&[\w.\-]+=)\S)*)")
# brackets: the optional scheme of a usage hint, [http[s]://]
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-\[\]]*://")
# what follows "@" in a connection address: host:port (an e-mail address has no port)
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[\w.\-]+):\d+")
_WHITESPACE = re.compile(r"(\s+)")


def mask_secrets(text: str) -> str:
    """``text`` (a URL, an etcd endpoint list, an error message or a whole log line) with every
    secret replaced by ``***``: ``redis://app:***@host:6379/0``, ``root:***@127.0.0.1:2379``,
    ``?password=***``. Masking twice changes nothing more."""
    if "@" not in text and "=" not in text:
        return text
    text = _SECRET_OPTION.sub(lambda m: m.group(1) + MASK, text)
    if "@" not in text:
        return text
    return "".join(_mask_word(w) if "@" in w else w for w in _WHITESPACE.split(text))


def _mask_word(word: str) -> str:
    """Mask the user info in one whitespace-free word: after each ``scheme://`` always, and in the
    text before the first scheme when it looks like credentials (see :func:`_mask_stretch`)."""
    out: list[str] = []
    pos = 0
    bare = True  # the stretch before the first scheme:// (scheme-less endpoints, free text)
    for m in _SCHEME.finditer(word):
        out.append(_mask_stretch(word[pos:m.start()], bare))
        out.append(m.group(0))
        pos, bare = m.end(), False
    out.append(_mask_stretch(word[pos:], bare))
    return "".join(out)


def _mask_stretch(s: str, bare: bool) -> str:
    """Mask the user info before each ``@`` of ``s``. A user info starts at the beginning of ``s``
    or after the first ``,`` that follows the previous ``@`` (the end of that member's host); an
    ``@`` with no ``,`` since the previous one belongs to the same password. ``bare`` (no scheme
    before it): mask only what looks like credentials (a ``:`` in it, or host:port after it)."""
    ats = [i for i, c in enumerate(s) if c == "@"]
    if not ats:
        return s
    regions: list[tuple[int, int]] = []
    for n, at in enumerate(ats):
        if n == 0:
            regions.append((0, at))
            continue
        comma = s.find(",", ats[n - 1] + 1, at)
        if comma == -1:  # the previous "@" was inside this password
            regions[-1] = (regions[-1][0], at)
        else:
            regions.append((comma + 1, at))
    out: list[str] = []
    pos = 0
    for start, at in regions:
        userinfo = s[start:at]
        if bare and ":" not in userinfo and not _HOST_PORT.match(s, at + 1):
            continue  # bob@example.com
        user, colon, password = userinfo.partition(":")
        if user.lstrip("[]").lower() == "user" and password.lower() == "password":
            continue  # the placeholder of a usage hint
        out.append(s[pos:start] + (user + ":" + MASK if colon and user else MASK))
        pos = at
    out.append(s[pos:])
    return "".join(out)
