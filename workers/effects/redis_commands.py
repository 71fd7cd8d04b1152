"""What a fenced Redis write may send, checked before anything is sent: the commands it allows,
their arguments, their keys' slot, and the fence key, as one :class:`Plan` (KEYS and ARGV of the
script in :mod:`.redis_script`).

The allow-list is deliberately short: data commands that take exactly one key, first, so that each
command's key is declared to Redis (``KEYS``: a Redis Cluster routes the call by it, and a script
touching an undeclared key is wrong there), and so that what the script checks before its first
write (the key types) and what it writes are known. Left out, with why:

* several keys (MSET, RENAME, SMOVE, LMOVE, SUNIONSTORE, ...): write one command per key instead;
* blocking (BLPOP, ...): not allowed in scripts;
* no key or not data (PUBLISH, EVAL, CONFIG, FLUSHALL, KEYS, SCAN, ...): not the user's keys;
* deprecated forms (GETSET: ``SET key value GET``; HMSET: HSET; SETEX/PSETEX stay, being common);
* random (SPOP, SRANDMEMBER): allowed by Redis but a surprise in a write meant to be reproducible.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from scheduler.redisio.routing import slot_of

from .outcomes import EffectsError
from .target import Target

COMMANDS_MAX = 1000  # commands per call: one script run blocks the server; keep it short
BYTES_MAX = 8 * 1024 * 1024  # keys and arguments of one call, encoded
ARGS_MAX = 7000  # arguments of one command: the script passes them through Lua's unpack (8000 stack slots)
FENCE_MARK = b"}:zsched:fx:"  # what the fence key has after its hash tag; no user key may have it


class Spec(NamedTuple):
    """One allowed command: the type its key must hold (``""``: any, or none), and how many
    arguments it takes after the key (``most`` None: no upper bound; ``pairs``: an even number)."""

    type: str
    least: int
    most: int | None
    pairs: bool = False


_S, _H, _L, _SET, _Z, _X, _ANY = "string", "hash", "list", "set", "zset", "stream", ""
ALLOWED: dict[str, Spec] = {
    # strings (SET, SETEX, PSETEX replace a key of any type; SET ... GET needs a string: see plan())
    "SET": Spec(_ANY, 1, 5), "SETEX": Spec(_ANY, 2, 2), "PSETEX": Spec(_ANY, 2, 2), "SETNX": Spec(_ANY, 1, 1),
    "GET": Spec(_S, 0, 0), "GETDEL": Spec(_S, 0, 0), "GETEX": Spec(_S, 0, 2), "STRLEN": Spec(_S, 0, 0),
    "GETRANGE": Spec(_S, 2, 2), "SETRANGE": Spec(_S, 2, 2), "APPEND": Spec(_S, 1, 1),
    "INCR": Spec(_S, 0, 0), "INCRBY": Spec(_S, 1, 1), "INCRBYFLOAT": Spec(_S, 1, 1),
    "DECR": Spec(_S, 0, 0), "DECRBY": Spec(_S, 1, 1),
    # any type
    "DEL": Spec(_ANY, 0, 0), "UNLINK": Spec(_ANY, 0, 0), "EXISTS": Spec(_ANY, 0, 0), "TYPE": Spec(_ANY, 0, 0),
    "EXPIRE": Spec(_ANY, 1, 2), "PEXPIRE": Spec(_ANY, 1, 2), "EXPIREAT": Spec(_ANY, 1, 2),
    "PEXPIREAT": Spec(_ANY, 1, 2), "PERSIST": Spec(_ANY, 0, 0), "TTL": Spec(_ANY, 0, 0), "PTTL": Spec(_ANY, 0, 0),
    # hashes
    "HSET": Spec(_H, 2, None, True), "HSETNX": Spec(_H, 2, 2), "HINCRBY": Spec(_H, 2, 2),
    "HINCRBYFLOAT": Spec(_H, 2, 2), "HDEL": Spec(_H, 1, None), "HGET": Spec(_H, 1, 1), "HMGET": Spec(_H, 1, None),
    "HGETALL": Spec(_H, 0, 0), "HEXISTS": Spec(_H, 1, 1), "HLEN": Spec(_H, 0, 0),
    # lists
    "LPUSH": Spec(_L, 1, None), "RPUSH": Spec(_L, 1, None), "LPUSHX": Spec(_L, 1, None),
    "RPUSHX": Spec(_L, 1, None), "LPOP": Spec(_L, 0, 1), "RPOP": Spec(_L, 0, 1), "LREM": Spec(_L, 2, 2),
    "LTRIM": Spec(_L, 2, 2), "LSET": Spec(_L, 2, 2), "LINDEX": Spec(_L, 1, 1), "LLEN": Spec(_L, 0, 0),
    "LRANGE": Spec(_L, 2, 2),
    # sets
    "SADD": Spec(_SET, 1, None), "SREM": Spec(_SET, 1, None), "SISMEMBER": Spec(_SET, 1, 1),
    "SCARD": Spec(_SET, 0, 0), "SMEMBERS": Spec(_SET, 0, 0),
    # sorted sets (ZADD's options come before its score/member pairs: Redis checks them)
    "ZADD": Spec(_Z, 2, None), "ZINCRBY": Spec(_Z, 2, 2), "ZREM": Spec(_Z, 1, None), "ZSCORE": Spec(_Z, 1, 1),
    "ZCARD": Spec(_Z, 0, 0), "ZRANGE": Spec(_Z, 2, 8), "ZREMRANGEBYSCORE": Spec(_Z, 2, 2),
    "ZREMRANGEBYRANK": Spec(_Z, 2, 2),
    # streams
    "XADD": Spec(_X, 3, None), "XTRIM": Spec(_X, 2, None), "XDEL": Spec(_X, 1, None), "XLEN": Spec(_X, 0, 0),
}
# Commands with more than one key: named in their refusal, which says how to write them instead
MULTI_KEY = frozenset({
    "MSET", "MSETNX", "MGET", "RENAME", "RENAMENX", "COPY", "SMOVE", "LMOVE", "RPOPLPUSH", "BLMOVE",
    "BRPOPLPUSH", "BLPOP", "BRPOP", "BLMPOP", "LMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP", "ZMPOP",
    "SINTERSTORE", "SUNIONSTORE", "SDIFFSTORE", "ZUNIONSTORE", "ZINTERSTORE", "ZDIFFSTORE", "ZRANGESTORE",
    "PFMERGE", "BITOP", "SORT", "GEORADIUS", "GEOSEARCHSTORE", "TOUCH",
})


@dataclass(frozen=True, slots=True)
class Plan:
    """One fenced write, checked and encoded: ``keys`` (the fence key, then each command's key)
    and ``args`` (the script's ARGV), with the commands' names and keys for messages."""

    fence_key: bytes
    keys: list[bytes]
    args: list[bytes]
    names: list[str]


def _value(what: str, v: Any, encode: Any) -> bytes:
    """``v`` as Redis gets it (the client's own encoder: its encoding, ``repr`` for floats)."""
    if isinstance(v, bool) or not isinstance(v, (str, bytes, int, float)):
        raise EffectsError(f"{what} is a {type(v).__name__}: keys and arguments are str, bytes, int or float "
                           "(convert it first; True/False and None have no one Redis spelling)")
    if isinstance(v, float) and math.isnan(v):
        raise EffectsError(f"{what} is NaN, which Redis cannot store or compare")
    return bytes(encode(v))


def shown(key: bytes) -> str:
    """A key for a message: its text (or bytes repr), cut at 60 characters."""
    try:
        text = repr(key.decode("utf-8"))
    except UnicodeDecodeError:
        text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def fence_key_of(first: bytes, t: Target) -> bytes:
    """The fence key of ``t`` beside the call's first key: ``{TAG}:zsched:fx:NS:ID:STEP``, where TAG
    is the first key's hash tag (its ``{...}`` content when not empty, else the whole key), so the
    fence key is in the first key's Redis Cluster slot. Raises :class:`EffectsError` for a first key
    without a hash tag that contains ``}`` (no fence key can then share its slot)."""
    s = first.find(b"{")
    e = first.find(b"}", s + 1) if s >= 0 else -1
    if s >= 0 and e > s + 1:
        tag = first[s + 1:e]
    elif b"}" in first:
        raise EffectsError(f"the first key {shown(first)} has '}}' but no hash tag, so no fence key can share "
                           "its cluster slot: give the call's keys a hash tag ('{tag}rest') or put another key first")
    else:
        tag = first
    step = f":{t.step}" if t.step else ""
    return b"{" + tag + FENCE_MARK + f"{t.namespace}:{t.job_id}{step}".encode()


def check_target(t: Target) -> None:
    """The fence key spells namespace and job id between ``:``; neither may have one, or two jobs
    could share a fence key."""
    for what, v in (("namespace", t.namespace), ("job id", t.job_id)):
        if ":" in v or "{" in v or "}" in v:
            raise EffectsError(f"fenced_write: the {what} {v!r} has ':', '{{' or '}}', which the fence key "
                               "cannot hold unambiguously")


def plan(commands: Sequence[Any], t: Target, retention_ms: int, encode: Any, *, same_slot: bool) -> Plan:
    """``commands`` checked and encoded into the script's KEYS and ARGV (see :mod:`.redis_script`),
    nothing sent; raises :class:`EffectsError` naming the first thing wrong. ``same_slot``: refuse
    keys of more than one Redis Cluster slot (a cluster client; one server takes any keys)."""
    check_target(t)
    if isinstance(commands, (str, bytes)) or not isinstance(commands, Sequence):
        raise EffectsError(f"fenced_write takes a list of (NAME, KEY, *ARGS) tuples, got {type(commands).__name__}")
    if not commands:
        raise EffectsError("fenced_write got no commands: give it at least one (NAME, KEY, *ARGS) tuple")
    if len(commands) > COMMANDS_MAX:
        raise EffectsError(f"fenced_write got {len(commands)} commands, more than {COMMANDS_MAX}: split the work "
                           "into several steps (step=...), each fenced on its own")
    keys: list[bytes] = []
    args = [str(t.fence).encode(), str(t.attempt).encode(), str(retention_ms).encode(), str(len(commands)).encode()]
    names: list[str] = []
    size = 0
    for i, cmd in enumerate(commands):
        name, spec, key, rest = _command(i, cmd, encode)
        size += len(key) + sum(len(a) for a in rest)
        if size > BYTES_MAX:
            raise EffectsError(f"fenced_write: keys and arguments pass {BYTES_MAX // (1024 * 1024)} MiB at "
                               f"commands[{i}]: split the work into several steps (step=...)")
        want = spec.type
        if name == "SET" and any(a.upper() == b"GET" for a in rest[1:]):
            want = _S  # SET ... GET reads the old value: WRONGTYPE on another type
        keys.append(key)
        names.append(name)
        args += [name.encode(), want.encode(), str(len(rest)).encode(), *rest]
    fence_key = fence_key_of(keys[0], t)
    for i, key in enumerate(keys):
        if key.startswith(b"{") and FENCE_MARK in key:
            raise EffectsError(f"fenced_write: commands[{i}]'s key {shown(key)} is a fence key "
                               "('{tag}:zsched:fx:...' is reserved for them)")
    if same_slot:
        _check_slots(keys)
    return Plan(fence_key, [fence_key, *keys], args, names)


def _command(i: int, cmd: Any, encode: Any) -> tuple[str, Spec, bytes, list[bytes]]:
    if isinstance(cmd, (str, bytes)) or not isinstance(cmd, (tuple, list)) or len(cmd) < 2:
        raise EffectsError(f"fenced_write: commands[{i}] is {_brief(cmd)}, not a (NAME, KEY, *ARGS) tuple")
    raw_name = cmd[0]
    if not isinstance(raw_name, str):
        raise EffectsError(f"fenced_write: commands[{i}] starts with {_brief(raw_name)}, not a command name")
    name = raw_name.upper()
    spec = ALLOWED.get(name)
    if spec is None:
        if name in MULTI_KEY:
            raise EffectsError(f"fenced_write: commands[{i}] is {name}, which takes several keys; a fenced write "
                               "sends one command per key (one key each, declared to Redis): write it as "
                               "single-key commands (MSET as SETs, RENAME as GET/SET/DEL, ...)")
        raise EffectsError(f"fenced_write: commands[{i}] is {name}, which it does not send; it sends data "
                           f"commands with one key, first: {', '.join(sorted(ALLOWED))}")
    key = _value(f"commands[{i}] ({name})'s key", cmd[1], encode)
    rest = [_value(f"commands[{i}] ({name})'s argument {j + 1}", a, encode) for j, a in enumerate(cmd[2:])]
    n = len(rest)
    if n < spec.least or (spec.most is not None and n > spec.most) or (spec.pairs and n % 2):
        raise EffectsError(f"fenced_write: commands[{i}] ({name} {shown(key)}) has {n} argument(s) after the key; "
                           f"{name} takes {_arity(spec)} here (one key per command: a second key is a second "
                           "command)")
    if n > ARGS_MAX:
        raise EffectsError(f"fenced_write: commands[{i}] ({name}) has {n} arguments, more than {ARGS_MAX}: "
                           "split it into several commands of the same call")
    return name, spec, key, rest


def _arity(spec: Spec) -> str:
    if spec.pairs:
        return f"pairs, {spec.least} or more"
    if spec.most is None:
        return f"{spec.least} or more"
    return str(spec.least) if spec.least == spec.most else f"{spec.least} to {spec.most}"


def _brief(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_slots(keys: list[bytes]) -> None:
    slot = slot_of(keys[0])
    other = [k for k in keys if slot_of(k) != slot]
    if other:
        raise EffectsError(
            f"fenced_write: the keys are in more than one Redis Cluster slot ({shown(keys[0])} in {slot}, "
            f"{shown(other[0])} in {slot_of(other[0])}); one script call runs on one slot: give them one hash "
            f"tag, e.g. '{{account:42}}:balance' and '{{account:42}}:ledger'")
