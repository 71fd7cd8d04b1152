"""The fast-path differential tests' pair of namespaces (tests/integration/test_*_fast_path.py):
``fa`` runs a script as shipped (fast path first), ``ge`` the same script without its fast path's
block (general path only, ``bench.script_cost.general_only``); a test sends both the same calls
and compares replies and state."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis

from bench.script_cost import general_only
from scheduler import Client
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.options import JobOptions
from scheduler.protocol.scripts import load_scripts
from tests.support.helpers import namespace_state

SIDES = ("fa", "ge")
"""The fast path's namespace, then the general path's."""


class ScriptPair:
    """Both namespaces of ``partitions`` partitions on the redis-server at ``url``, ``script``'s
    two variants loaded (``fast``, ``general``) and the shipped ``others`` (``sha``) to set them up;
    ``client`` is a client of ``fa`` (its calls builder prepares jobs for both). ``declared``: how many
    of the partition's keys ``script``'s calls declare (14, or 1 as off a cluster: the timer set)."""

    def __init__(self, url: str, script: str, partitions: int, others: tuple[str, ...], declared: int = 14) -> None:
        self.r = redis.Redis.from_url(url)
        self.name, self.declared = script, declared
        scripts = load_scripts()
        self.fast = self.r.script_load(scripts[script].source)
        self.general = self.r.script_load(general_only(script))
        assert self.fast != self.general
        self.sha = {name: self.r.script_load(scripts[name].source) for name in others}
        self.client = Client.from_url(url, namespace="fa", partitions=partitions).connect()
        Client.from_url(url, namespace="ge", partitions=partitions).connect().close()
        self.ks = {ns: Keyspace(ns, partitions) for ns in SIDES}
        self.fast_runs = 0  # calls on fa that took the fast path to its end (each test counts its own way)

    def close(self) -> None:
        self.client.close()
        self.r.close()

    def script(self, ns: str, name: str) -> str:
        """The sha to run ``name`` with on side ``ns``: the pair's script's variant, or a shipped one."""
        return self.sha.get(name) or (self.fast if ns == "fa" else self.general)

    def keys(self, ns: str, name: str, partition: int) -> list[str]:
        """The keys a call of ``name`` on side ``ns`` declares."""
        keys = self.ks[ns].partition_keys(partition)
        return keys[:self.declared] if name == self.name else keys

    def counts(self) -> Counter[str]:
        """Redis's calls per command so far (scripts' commands included): what a call sent is the
        difference of two readings."""
        stats = self.r.info("commandstats")
        return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})

    def schedule_args(self, at: float, partition: int, queue: str, key: str | None = None,
                      **opts: Any) -> list[Any]:
        """A ``schedule`` call's arguments after the common ones for a new job of ``queue`` in
        ``partition``, due at ``at`` (epoch s): ids are drawn until one falls there. Sent to both
        sides, it makes the same job (same id and record) on each."""
        while True:
            _, _, args = self.client.calls.prepare_one(at, {"q": queue}, key, JobOptions(queue=queue, **opts))
            if int(str(args[2]).split("/")[0]) == partition:
                return list(args[3:])

    def state(self, ns: str) -> dict[str, Any]:
        """Side ``ns``'s keys as ``namespace_state`` reads them; a test overrides this to normalise
        what its calls stamp differently on the two sides (times, tokens)."""
        return namespace_state(self.r, ns)

    def assert_same_state(self, step: str) -> None:
        """The two sides' states are equal, or the differing keys are named."""
        a, b = self.state("fa"), self.state("ge")
        diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
        assert not diff, f"{step}: the namespaces differ (key: fast path's, general path's): {diff}"


def stamped_by_shape(name: str, h: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A hash of ``namespace_state`` with what each side's clock stamps replaced by its shape:
    meta's token fence, the lease tokens of 'l', the time of each error in 'e'."""
    if name.endswith(":meta"):  # the token fence: when, not whether
        return {k: (b"<us>" if k == b"fence" else v) for k, v in h.items()}
    if name.endswith(":l"):
        return {k: b"<token>" for k in h}
    if name.endswith(":e"):  # errors: when, then what
        return {k: v[v.index(b"\0"):] for k, v in h.items()}
    return h


def members_only(name: str, z: list[Any]) -> list[Any]:
    """A sorted set of ``namespace_state`` without its scores where each side's clock sets them:
    leases 'i', dead jobs 'd', timers 't'."""
    return sorted(m for m, _ in z) if name.endswith((":i", ":d", ":t")) else z


P = TypeVar("P", bound=ScriptPair)


def pair_fixture(make: Callable[[str, int], P]) -> Any:
    """A ``pair`` fixture (assign it to ``pair`` in the test module): ``make(redis_url, declared)``,
    run once with every key declared and once with the timer set alone, as off a cluster."""
    @pytest.fixture(params=[14, 1], ids=["every key declared", "the timer set alone (off a cluster)"])
    def pair(redis_url: str, request: pytest.FixtureRequest) -> Iterator[P]:
        p = make(redis_url, request.param)
        yield p
        p.close()
    return pair
