"""The Lua script of a fenced Redis write, and what its reply means.

It lives here, not in ``lua/``: the files there are zsched's own scripts (``SCRIPT_NAMES``), run
by zsched's transports on zsched's Redis with the helper library linked in, refusing bad arguments
with ``ZSCHED_ARG`` status codes and carrying the partition hash tag ``{ns:p}`` on every key; the
transports load all of them. This one runs on the user's own Redis (any server, any keys), through
the user's redis-py client, links nothing of the library, and its arguments are all checked in
Python first (:mod:`.redis_commands`).
"""
from __future__ import annotations

import hashlib
from typing import Any

from scheduler.protocol.scripts import strip_comments
from scheduler.protocol.timeutil import ms_to_datetime

from .outcomes import EffectsError, PartialWrite, skip
from .redis_commands import Plan, shown
from .target import Target

SOURCE = r"""
-- fenced_write: a handler's writes to the user's own keys, applied once per (namespace, job, step).
-- KEYS: KEYS[1] the fence key '{TAG}:zsched:fx:NS:JOBID[:STEP]' (TAG: the first command key's hash tag);
--       KEYS[1 + i] command i's key (a key may repeat); all of one cluster slot (checked by the caller).
-- ARGV: ARGV[1] fence (decimal, this attempt's lease token), ARGV[2] attempt (decimal),
--       ARGV[3] retention_ms (1 .. 2^48: the fence key's TTL), ARGV[4] n (commands, 1 .. 1000);
--       then per command: its name (upper case, of the caller's allow-list), the type its key must
--       hold ('' any), its argument count c, then its c arguments.
-- Refuses: a call whose KEYS and ARGV do not match that layout (an error reply, nothing read or written).
-- Returns: {1, reply_1, ..., reply_n}: applied now; the fence key records 'FENCE ATTEMPT MS'.
--          {0, record}: the fence key existed, nothing was written; record is 'FENCE ATTEMPT MS'
--          (applied by that attempt) or 'FENCE ATTEMPT MS I ERROR' (that attempt failed at command I).
--          {2, i, error}: refused before any write, nothing written: command i's key holds another
--          type than the command needs (checked for keys no earlier command of the call touches),
--          or command 0 itself failed (its write undone with the fence key's, nothing else ran).
--          {3, record}: command i (i >= 1) failed; commands 0 .. i-1 stayed applied (no rollback),
--          the fence key records 'FENCE ATTEMPT MS I ERROR', without TTL, until someone deletes it.
-- Invariants: the writes of one (namespace, job, step) apply at most once while its fence key lives:
--   the fence key is read first and, when present, nothing is written; otherwise it is set before
--   the first command, in the same atomic call. Every check (layout, types) comes before the first
--   write. A re-sent call (lost reply) finds its own record: {0, record} with its own fence.
--   A partial record never expires by itself: the commands before the failure are not applied twice.
-- Uses: none (not linked with lua/_lib*.lua)
local n = tonumber(ARGV[4])
if not n or n < 1 or #KEYS ~= n + 1 then
  return redis.error_reply('zsched: fenced_write: malformed call (KEYS and commands do not match)')
end
local cmds, at = {}, 5
for i = 1, n do
  local c = tonumber(ARGV[at + 2])
  if not c or c < 0 or at + 2 + c > #ARGV then
    return redis.error_reply('zsched: fenced_write: malformed call (command ' .. (i - 1) .. ')')
  end
  cmds[i] = {ARGV[at], ARGV[at + 1], at + 3, at + 2 + c}
  at = at + 3 + c
end
if at ~= #ARGV + 1 then
  return redis.error_reply('zsched: fenced_write: malformed call (arguments left over)')
end

local fence_key = KEYS[1]
local recorded = redis.call('GET', fence_key)
if recorded then return {0, recorded} end

-- No rollback in Redis: refuse what would fail for its key's type before writing anything
local seen = {}
for i = 1, n do
  local key, want = KEYS[i + 1], cmds[i][2]
  if want ~= '' and not seen[key] then
    local has = redis.call('TYPE', key)['ok']
    if has ~= 'none' and has ~= want then
      return {2, i - 1, 'WRONGTYPE the key holds a ' .. has .. ', ' .. cmds[i][1] .. ' needs a ' .. want}
    end
  end
  seen[key] = true  -- an earlier command may change its type: the run itself tells
end

local now = redis.call('TIME')
local head = ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('SET', fence_key, head, 'PX', ARGV[3])
local out = {1}
for i = 1, n do
  local c = cmds[i]
  local reply = redis.pcall(c[1], KEYS[i + 1], unpack(ARGV, c[3], c[4]))
  if type(reply) == 'table' and reply['err'] then
    local err = tostring(reply['err'])  -- a Lua string on Redis; fakeredis' pcall gives a Python str
    if i == 1 then
      redis.call('DEL', fence_key)
      return {2, 0, err}
    end
    local record = head .. ' ' .. (i - 1) .. ' ' .. err
    redis.call('SET', fence_key, record)
    return {3, record}
  end
  out[i + 1] = reply
end
return out
"""

SCRIPT = strip_comments(SOURCE)
SHA = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()
APPLIED, RECORDED, REFUSED, PARTIAL = 1, 0, 2, 3


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def outcome(reply: Any, p: Plan, t: Target) -> list[Any]:
    """The commands' replies of an applied call; raises what any other reply means: an
    :class:`EffectSkipped` (the step was recorded), :class:`PartialWrite` (a command failed after
    others applied, now or in an earlier attempt), or :class:`EffectsError` (refused, nothing
    written)."""
    if not isinstance(reply, list) or not reply:
        raise EffectsError(f"fenced_write: unexpected script reply {reply!r}")
    code = int(reply[0])
    if code == APPLIED:
        return list(reply[1:])
    if code == REFUSED:
        i = int(reply[1])
        raise EffectsError(f"job {t.job_id}{_step(t)}: fenced Redis write refused, nothing written: commands[{i}] "
                           f"({_command(p, i)}): {_text(reply[2])}; fix the key or the command (the job's retry "
                           "then writes)")
    if code in (RECORDED, PARTIAL):
        fields = _text(reply[1]).split(" ", 4)
        fence, attempt, ms = int(fields[0]), int(fields[1]), int(fields[2])
        if len(fields) == 5:
            raise partial(t, p, fence, attempt, int(fields[3]), fields[4], now=code == PARTIAL)
        raise skip(t.job_id, t.step, t.fence, fence, attempt, ms_to_datetime(ms))
    raise EffectsError(f"fenced_write: unexpected script reply {reply!r}")


def _step(t: Target) -> str:
    return f" (step {t.step!r})" if t.step else ""


def _command(p: Plan, i: int) -> str:
    # the keys start with the fence key's; a later attempt may send other commands than the failed one
    return f"{p.names[i]} {shown(p.keys[i + 1])}" if 0 <= i < len(p.names) else "not in this call"


def partial(t: Target, p: Plan, fence: int, attempt: int, index: int, error: str, *, now: bool) -> PartialWrite:
    """The :class:`PartialWrite` for a record of attempt ``attempt`` that failed at command
    ``index`` with ``error``; ``now``: this call failed (else an earlier attempt's did)."""
    who = "this attempt" if now else f"attempt {attempt} (fence {fence})"
    return PartialWrite(
        f"job {t.job_id}{_step(t)}: fenced Redis write by {who} failed at commands[{index}] ({_command(p, index)}): "
        f"{error}; the {index} command(s) before it (commands[:{index}]) stayed applied (Redis has no rollback) "
        f"and no attempt applies them again: repair the keys, then delete the fence key {_text(p.fence_key)!r} "
        "to let the job write anew",
        index)
