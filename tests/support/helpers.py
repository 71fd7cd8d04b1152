"""Test helpers: a full invariant check of a namespace's Redis state ("every live job is in
exactly one state"). Script calls without a worker: :mod:`scheduler.testing.transitions`."""
from __future__ import annotations

import asyncio
import re
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from scheduler import Client
from scheduler.protocol.calls import Calls
from scheduler.protocol.codec import TOMBSTONE_HEADER, decode_tombstone
from scheduler.protocol.ids import ID_BYTES, encode_id, partition_for_key, partition_of
from scheduler.redisio.connection import SyncRedis

PAST = 1_000_000_000.0
"""An absolute time long gone (2001-09-09T01:46:40Z, epoch seconds): a job due at once, sent as an
absolute run_at (``timedelta(0)`` is resolved by Redis's clock instead)."""

BACKENDS = ("single", "cluster")
"""The Redis deployments a test may run against (params of the ``backend_url`` fixture)."""
on_both_backends = pytest.mark.parametrize("backend_url", BACKENDS, indirect=True)
"""Run the test once on a single redis-server and once on a 3-master Redis Cluster: the test takes
the ``backend_url`` fixture (tests/conftest.py) instead of ``redis_url``."""


def tombstones(r: SyncRedis, client: Client) -> dict[str, str]:
    """Map job id -> state (done, cancelled, misfired) for every tombstone summary (the ``f``
    hashes), asserting each is well-formed and in its own partition."""
    ks = client.keyspace
    out: dict[str, str] = {}
    for p in range(ks.partitions):
        for raw, v in r.hgetall(ks.key(p, "f")).items():
            assert len(raw) == ID_BYTES and partition_of(raw, ks.partitions) == p, f"tombstone {raw!r} in partition {p}"
            assert len(v) >= TOMBSTONE_HEADER, f"tombstone of {encode_id(raw)} is {len(v)} bytes"
            t = decode_tombstone(v)
            assert t.expires_ms >= t.finished_ms, f"tombstone of {encode_id(raw)} expires before it was written"
            assert t.attempts <= t.max_attempts or t.max_attempts == 0, encode_id(raw)
            out[encode_id(raw)] = t.state
    return out


def snapshot(r: SyncRedis, client: Client) -> dict[str, dict[str, str]]:
    """Map job id -> state for every job in live structures; asserts the structural invariants
    (also: no finished job's tombstone names a live job, and only live jobs have a last error)."""
    ks = client.keyspace
    states: dict[str, str] = {}
    seen: Counter[str] = Counter()
    for p in range(ks.partitions):
        k = dict(zip(("t", "m", "j", "i", "l", "d", "e", "kk", "x", "q", "g", "c", "meta", "f"),
                     ks.partition_keys(p)))
        timers = r.zrange(k["t"], 0, -1, withscores=True)
        moved = {f: int(v) for f, v in r.hgetall(k["m"]).items()}
        bodies = r.hgetall(k["j"])
        inflight = dict(r.zrange(k["i"], 0, -1, withscores=True))
        leases = r.hgetall(k["l"])
        dead = dict(r.zrange(k["d"], 0, -1, withscores=True))
        qnames = {v.decode(): int(kk[2:]) for kk, v in r.hgetall(k["q"]).items() if kk.startswith(b"i:")}
        gauges = {f.decode(): int(v) for f, v in r.hgetall(k["g"]).items()}
        gcount: Counter[str] = Counter()
        qname_of = {int(kk[2:]): v.decode() for kk, v in r.hgetall(k["q"]).items() if kk.startswith(b"i:")}
        timer_ids = set()
        for member, score in timers:
            raw, rec = member[:ID_BYTES], member[ID_BYTES:]
            assert partition_of(raw, ks.partitions) == p
            jid = encode_id(raw)
            assert raw not in timer_ids, f"{jid} twice in timers"
            timer_ids.add(raw)
            expected_score = moved.get(raw, int.from_bytes(raw[:6], "big"))
            assert int(score) == expected_score, f"{jid}: timer score {score} but id/moved say {expected_score}"
            states[jid] = "scheduled"
            seen[jid] += 1
            gcount["s:" + qname_of[int.from_bytes(rec[:2], 'big')]] += 1
        assert set(moved) <= timer_ids, "moved entries for jobs not in timers"
        ready_ids: dict[bytes, str] = {}
        for name in qnames:
            for raw in r.lrange(ks.ready(p, name), 0, -1):
                assert raw not in ready_ids, f"{encode_id(raw)} twice in ready lists"
                ready_ids[raw] = name
        for raw in ready_ids:
            states[encode_id(raw)] = "ready"
            seen[encode_id(raw)] += 1
            assert raw in bodies, f"{encode_id(raw)} ready without a body"
        held: set[bytes] = set()
        for name in qnames:
            for raw in r.zrange(ks.key(p, "h:" + name), 0, -1):
                held.add(raw)
                states[encode_id(raw)] = "scheduled"
                seen[encode_id(raw)] += 1
                assert raw in bodies, f"{encode_id(raw)} held without a body"
                gcount["s:" + name] += 1
                gcount["h:" + name] += 1
        for raw in inflight:
            states[encode_id(raw)] = "running"
            seen[encode_id(raw)] += 1
            assert raw in bodies and raw in leases, f"{encode_id(raw)} running without body or token"
            rec = bodies[raw][6:]
            gcount["a:" + qname_of[int.from_bytes(rec[:2], 'big')]] += 1
        assert set(leases) == set(inflight), "lease tokens and in-flight set differ"
        for raw in dead:
            states[encode_id(raw)] = "dead"
            seen[encode_id(raw)] += 1
            assert raw in bodies
            rec = bodies[raw][6:]
            gcount["d:" + qname_of[int.from_bytes(rec[:2], 'big')]] += 1
        for raw in bodies:
            assert raw not in timer_ids, f"{encode_id(raw)} both in timers and bodies"
            assert raw in ready_ids or raw in inflight or raw in dead or raw in held, \
                f"{encode_id(raw)} body without a state"
        for name, v in gauges.items():
            assert v == gcount.get(name, 0), f"gauge {name}={v} but counted {gcount.get(name, 0)} (partition {p})"
        for name, v in gcount.items():
            assert gauges.get(name, 0) == v, f"gauge {name} missing: counted {v}"
        for raw in r.hkeys(k["e"]):
            assert encode_id(raw) in states, f"{encode_id(raw)} has a last error but is not live (leaked 'e' entry)"
    dup = [j for j, n in seen.items() if n > 1]
    assert not dup, f"jobs in more than one state: {dup[:5]}"
    both = set(tombstones(r, client)) & set(states)
    assert not both, f"jobs both live and finished (tombstone): {sorted(both)[:5]}"
    return states


def namespace_state(r: Any, ns: str,
                    hash_fix: Callable[[str, dict[bytes, bytes]], dict[bytes, bytes]] = lambda name, h: h,
                    zset_fix: Callable[[str, list[Any]], list[Any]] = lambda name, z: z) -> dict[str, Any]:
    """Every key of namespace ``ns``'s partitions and its doorbells, by name with ``ns`` replaced,
    for comparing two namespaces that got the same calls (the fast-path differential tests). The
    doorbells give which partitions rang, not when; queue activity stamps (``:q`` ``u:``) and the
    times of tombstones (``:f``) are normalised, as two calls microseconds apart differ in them,
    and so are the minutes of the last-hour hashes (``:hist:M``: their counts are summed per
    partition, as the two sides' calls may fall either side of a minute's end);
    ``hash_fix`` / ``zset_fix`` (key name, content) normalise what else a test's calls stamp."""
    out: dict[str, Any] = {}
    for raw in r.scan_iter(match=f"{{{ns}}}:bell:*"):
        out[raw.decode().replace(ns, "NS", 1)] = sorted(m for m, _ in r.zrange(raw, 0, -1, withscores=True))
    for raw in r.scan_iter(match=f"{{{ns}:*"):  # the partitions (not the namespace config)
        name = raw.decode().replace(ns, "NS", 1)
        kind = r.type(raw).decode()
        if kind == "hash":
            h = r.hgetall(raw)
            minute = re.fullmatch(r"(.*:hist:)\d+", name)
            if minute:
                total = out.setdefault(minute.group(1) + "<minute>", {})
                for k, v in h.items():
                    total[k] = str(int(total.get(k, 0)) + int(v)).encode()
                continue
            if name.endswith(":q"):  # queue activity stamps: when, not whether
                h = {k: (b"<ms>" if k.startswith(b"u:") else v) for k, v in h.items()}
            if name.endswith(":f"):  # tombstones: letter, finished and expiry ms, rest
                h = {k: v[:1] + v[13:] for k, v in h.items()}
            out[name] = hash_fix(name, h)
        elif kind == "zset":
            out[name] = zset_fix(name, r.zrange(raw, 0, -1, withscores=True))
        elif kind == "list":
            out[name] = r.lrange(raw, 0, -1)
        else:
            out[name] = (kind, r.dump(raw))
    return out


def raw_call(calls: Calls, name: str, partition: int, *args: Any) -> tuple[str, list[str], list[Any]]:
    """Script ``name``'s call on ``partition`` with its ARGV (after the common ones) put together by
    hand: only for what the typed builders of :mod:`scheduler.protocol` refuse to make (an argument
    malformed on purpose, a hand-made record re-sent). Every other call in a test uses its
    script's builder, as production code must (tests/unit/test_architecture.py)."""
    name, keys, argv = calls.call(name, partition, *args)
    return name, list(keys), list(argv)


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, str]:
    """(HTTP status, body) of ``GET http://127.0.0.1:PORT/PATH`` (a process's /metrics, /livez or
    /readyz); (0, the error) while nothing answers there (not listening yet, or frozen)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return int(r.status), bytes(r.read()).decode()
    except urllib.error.HTTPError as exc:
        return exc.code, bytes(exc.read()).decode()
    except OSError as exc:
        return 0, str(exc)


async def ahttp_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, str]:
    """:func:`http_get` from a test running on the event loop of the process it probes: on a
    thread, as a kubelet would, since the probes wait for that loop to answer."""
    return await asyncio.to_thread(http_get, port, path, timeout)


async def ready(port: int) -> bool:
    """Whether the process serving probes on ``port`` answers ``/readyz`` with 200 (from a thread)."""
    return (await ahttp_get(port, "/readyz"))[0] == 200


def command_calls(r: Any, command: str) -> int:
    """How many ``command`` calls Redis served since the last CONFIG RESETSTAT (``r``: a sync client)."""
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


@contextmanager
def probing(port: int, path: str = "/readyz", every: float = 0.25,
            timeout: float = 2.0) -> Iterator[list[tuple[int, str]]]:
    """Probe ``path`` every ``every`` s from a thread while the block runs, as a kubelet does (the
    probes' checks run only when asked; each waits up to ``timeout`` s); yields the answers so far."""
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            seen.append(http_get(port, path, timeout))
            done.wait(every)

    thread = threading.Thread(target=run, name=f"probe-{port}", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(10)


def keys_in(partition: int, partitions: int, tag: str, n: int = 1) -> list[str]:
    """``n`` idempotency keys (``TAG-I``) whose jobs land in ``partition`` of ``partitions``."""
    keys = (f"{tag}-{i}" for i in range(10_000 * n))
    out = [k for k in keys if partition_for_key(k, partitions) == partition][:n]
    assert len(out) == n, f"fewer than {n} keys of partition {partition} among the first tried"
    return out


def key_in(partition: int, partitions: int, tag: str) -> str:
    """An idempotency key whose job lands in ``partition`` of ``partitions``."""
    return keys_in(partition, partitions, tag)[0]
