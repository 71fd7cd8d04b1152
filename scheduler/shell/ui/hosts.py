"""Host names for the console, without the web packages (``zsched ui`` checks its arguments with
these before it imports them): parsing a Host header or an ``--allowed-host`` value, the
``--trust-proxy`` networks, and :class:`HostPolicy`, which Host headers the console answers to.
The rules, and why, are in :mod:`.gate`.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

from .security import DEFAULT_PORTS

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK_PROXIES: tuple[IPNetwork, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_PORT = re.compile(r"[0-9]{1,5}")


def parse_host(text: str) -> tuple[str, int | None]:
    """A Host header (or an ``--allowed-host`` value) -> (name lowercased without a trailing dot, or
    an IP address in its canonical text; port or None). ValueError saying why when malformed."""
    if text.startswith("["):
        inner, close, rest = text[1:].partition("]")
        try:
            name = str(ipaddress.IPv6Address(inner))
        except ValueError:
            name = ""
        if not name or not close or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r} is not [IPv6 address] with an optional :port")
        port_text = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            raise ValueError(f"{text!r}: an IPv6 address goes in brackets, [::1]:8089")
        name, colon, after = text.partition(":")
        port_text = after if colon else None
        name = name.lower()
        name = name[:-1] if name.endswith(".") else name
        try:
            name = str(ipaddress.IPv4Address(name))
        except ValueError:
            if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
                raise ValueError(f"{text!r} is not a host name or address with an optional :port") from None
            if name.replace(".", "").isdigit():
                raise ValueError(f"{text!r} is neither an IPv4 address nor a host name") from None
    if port_text is None:
        return name, None
    if not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return name, int(port_text)


def is_address(name: str) -> bool:
    """Whether a parsed host name is an IP address."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """``--trust-proxy`` addresses: IPs or networks (CIDR), comma-separated. ValueError when bad."""
    nets = []
    for part in (p.strip() for p in text.split(",")):
        try:
            nets.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"{part!r} is not an IP address or network (e.g. 127.0.0.1, 10.0.0.0/8, ::1)") from None
    return tuple(nets)


class HostPolicy:
    """Which Host headers the console answers to (see the module docstring)."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed: dict[str, int | None] = {}
        for entry in allowed:
            name, port = parse_host(entry)
            if name in self.allowed and self.allowed[name] != port:
                port = None  # NAME and NAME:PORT (or two ports): any port
            self.allowed[name] = port

    def refusal(self, hosts: Sequence[str], scheme: str, server_port: int | None) -> tuple[int, str] | None:
        """None when ``hosts`` (the request's Host headers) names the console, else (status, why)."""
        if len(hosts) != 1:
            return 400, "a request needs exactly one Host header"
        try:
            name, port = parse_host(hosts[0])
        except ValueError as exc:
            return 400, f"bad Host header: {exc}"
        effective = port or DEFAULT_PORTS.get(scheme, 80)
        if name in self.allowed and self.allowed[name] in (None, effective):
            return None
        if (name == "localhost" or is_address(name)) and (server_port is None or effective == server_port):
            return None
        shown = hosts[0] if len(hosts[0]) <= 100 else hosts[0][:97] + "..."
        return 421, (f"this console does not answer to the host {shown!r} (a page elsewhere pointing its name "
                     "at this machine?); if that is the name you reach it by, start zsched ui with "
                     "--allowed-host NAME")
