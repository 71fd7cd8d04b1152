"""The blocking :class:`~scheduler.Client` and the asyncio :class:`~scheduler.AsyncClient` are one
API: the same public names, the same parameters (names, kinds, defaults, annotations), the same
return types (a coroutine's result; a client's own class), the same documentation (one text, kept
on ``Client``), and ``with``/``async with`` both connect. The differences allowed are listed with
their reason."""
from __future__ import annotations

import inspect
from typing import Any

import pytest

from scheduler import AsyncClient, Client

# a property cannot await: the asyncio client's raise before connect(), the blocking one's connect
PROPERTIES_THAT_CONNECT = {"calls", "keyspace"}


def public(cls: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("_")} | {"__init__"}


def test_both_clients_have_the_same_public_names() -> None:
    assert public(Client) == public(AsyncClient)


def resolved(cls: type, name: str) -> inspect.Signature:
    fn = getattr(cls, name)
    return inspect.signature(fn, eval_str=True, globals=vars(inspect.getmodule(fn)))


def same_type(a: Any, b: Any) -> bool:
    """``a`` (blocking) and ``b`` (asyncio) are the same type, a client being its own class."""
    swap = {Client: AsyncClient, "Client": "AsyncClient"}
    return b == swap.get(a, a) or str(b) == str(a).replace("Client", "AsyncClient")


METHODS = sorted(n for n in public(Client) if n not in PROPERTIES_THAT_CONNECT)


@pytest.mark.parametrize("name", METHODS)
def test_each_method_takes_the_same_parameters_and_returns_the_same_type(name: str) -> None:
    sync, aio = resolved(Client, name), resolved(AsyncClient, name)
    if name != "__init__":  # the redis-py client passed in is a blocking or an asyncio one
        assert list(sync.parameters) == list(aio.parameters)
    for p in list(sync.parameters.values())[2 if name == "__init__" else 0:]:
        q = aio.parameters[p.name]
        assert (q.kind, q.default) == (p.kind, p.default), f"{name}({p.name})"
        assert same_type(p.annotation, q.annotation), f"{name}({p.name}): {p.annotation} vs {q.annotation}"
    assert same_type(sync.return_annotation, aio.return_annotation), name
    is_coroutine = inspect.iscoroutinefunction(getattr(AsyncClient, name))
    assert is_coroutine is (name not in ("__init__", "from_url")), f"{name}: coroutine or not"


@pytest.mark.parametrize("name", METHODS)
def test_each_method_has_one_text_for_both_clients(name: str) -> None:
    assert inspect.getdoc(getattr(Client, name)), f"Client.{name} has no docstring"
    assert inspect.getdoc(getattr(AsyncClient, name)) == inspect.getdoc(getattr(Client, name))


def test_the_one_difference_is_documented_on_both() -> None:
    assert "connects on first use" in (inspect.getdoc(Client.calls.fget) or "")  # type: ignore[attr-defined]
    assert "before ``connect()``" in (inspect.getdoc(AsyncClient.calls.fget) or "")  # type: ignore[attr-defined]
    assert "a property cannot await" in " ".join((inspect.getdoc(Client) or "").split())


def test_with_and_async_with_both_connect() -> None:
    """``with Client(...)`` connects on entry, as ``async with AsyncClient(...)`` does: a wrong
    partition count or an unreachable Redis shows at the ``with``, not at the first call."""
    assert "self.connect()" in inspect.getsource(Client.__enter__)
    assert "self.connect()" in inspect.getsource(AsyncClient.__aenter__)
