-- _lib_args.lua: the arguments every script gets and their checks; the first part of the
-- library (_lib.lua, _lib_finish.lua and _lib_cron.lua follow: scheduler/protocol/scripts.py).
--
-- Common calling convention of partition scripts:
--   KEYS[1..14] = the partition's keys, in scheduler/protocol/keys.py PARTITION_KEYS order
--     (schedule may pass KEYS[1] alone; see K_T in _lib.lua):
--     t (timers zset), m (moved hash), j (bodies hash: due(6) .. record), i (in-flight zset), l (lease tokens hash),
--     d (dead zset), e (errors hash), k (idempotency keys hash), x (legacy tombstones zset, drained by tick),
--     q (queue names hash), g (gauges hash), c (counters hash), meta (fence, epoch, fcur),
--     f (finished jobs: tombstone summaries hash, see tombstone() in _lib_finish.lua)
--   ARGV[1] = partition key prefix "{ns:p}:"  (ready lists are PREFIX .. "r:" .. queue, same slot; so
--             are the last hour's minute hashes PREFIX .. "hist:" .. minute, see tally in _lib.lua)
--   ARGV[2] = channel prefix CHAN             (wake: CHAN.."wake", ready: CHAN.."ready:"..queue,
--             epoch reset: CHAN.."epoch-reset"): "ns:" for plain pub/sub, or in sharded mode (Redis
--             Cluster) the partition prefix "{ns:p}:", so the channel hashes to this partition's slot.
--             Scripts publish only through publish(), which picks PUBLISH or SPUBLISH from CHAN.
--   ARGV[3] = partition number (the pub/sub message), followed by "/" and the caller's partition
--             count for the scripts guarded by layout_fence() (_lib.lua); "p" alone for the ones
--             that finish a running job (ack, fail, extend, release) and for epoch_reset
--   ARGV[4..] script-specific, see each script's header.
-- Times are Redis server milliseconds (TIME). Jitter is always computed by the caller: Redis's
-- Lua random generator is deterministic.
local PREFIX, CHAN = ARGV[1] or '', ARGV[2] or '' -- checked by COMMON below
-- Argument checks. Every script checks all of its arguments (and KEYS) before its first write:
-- Redis does not roll a script back, so an error raised halfway would leave half a transition (a
-- claim that moved jobs to running and then failed on its receipt's TTL never tells the worker
-- which jobs it took). A bad argument refuses the call, before anything is written, with
--   ZSCHED_ARG SCRIPT ARGV[n] NAME: expected WHAT, got "VALUE"
-- (VALUE cut at 40 bytes, bytes outside printable ASCII shown as '?'; "ARGV count" or "KEYS count"
-- for a wrong number of them), which scheduler/protocol/codes.py maps to ScriptArgumentError.
-- SCRIPT is the script's name: the loader writes it as its first line. The limits are the Python
-- side's (tests/unit/test_script_arguments.py compares them): names as validate_name
-- (scheduler/protocol/keys.py), idempotency keys codec.MAX_KEY_BYTES, times and durations
-- timeutil.MAX_MS, leases and misfire grace options.MAX_LEASE_S and MAX_GRACE_S (record_problem),
-- jobs per schedule call calls.BATCH. A number is what tonumber reads (Python sends decimal integers),
-- finite, whole and in its range, and the scripts use the number, never the text: 'nan', 'inf',
-- '1e309', '-1' or '1.5' never reach a Redis command.
-- Cost (callgrind, redis-server 7.0): a pattern or tonumber is about 1.5 k instructions, a VM
-- operation 35, and every closure 0.5 k plus 0.3 k per local it captures, built on every call
-- whether it runs or not. So ARGV 1-3 are checked by the library's own first lines (COMMON, no
-- closure), every other check goes through one closure (arg), and the hot scripts (schedule, tick,
-- claim, ack, fail, extend, release) test their arguments inline, with the numbers they parse
-- anyway, calling arg only when that test failed, to name the culprit.
local MAX_MS = 253402300799999 -- 9999-12-31T23:59:59.999Z: the largest time or duration in ms
local MAX_INT = 9007199254740991 -- 2^53 - 1: counts, epochs, tokens (larger ones are not exact)
local NAME_MAX, KEY_MAX, BATCH_MAX = 64, 200, 1000
-- a queue, cron or namespace name (validate_name) matches this and has at most NAME_MAX bytes; the
-- patterns that contain a name (COMMON's, schedule's fast path's, a bucket's) spell it out too
local NAME_PATTERN = '^[A-Za-z0-9][A-Za-z0-9_.%-]*$'
-- tick's and reap's batch and claim's job count: the tier's --batch limit, under Lua's unpack limit
local BATCH_LIMIT_MAX = 5000
-- ARGV 1-3 and KEYS[1], read together by one pattern (%1 and %2 repeat NS and P): the prefix
-- "{NS:P}:" (NS a namespace name, validate_name; P from 0 to 4095), "P" or "P/COUNT" (COUNT above P,
-- at most 4096), KEYS[1] the prefix's timer set 't' (the other KEYS follow keys.py
-- PARTITION_KEYS), and the channel prefix "NS:", or the prefix itself (sharded pub/sub). COMMON
-- is true when all of it is good; a script also checks #KEYS, and when either fails calls
-- arg('common', nkeys), which names the culprit. PART and LAYOUT ('' without a count) are nil
-- then. Decimal strings are compared by length, then with '<' (strcoll, which orders the digits
-- 0-9 in every locale).
local COMMON_NS, PART, LAYOUT = string.match(
  PREFIX .. '|' .. (ARGV[3] or '') .. '|' .. (KEYS[1] or '') .. '|' .. (CHAN ~= PREFIX and CHAN or ''),
  CHAN ~= PREFIX and '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|%1:$' or
    '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|$')
local COMMON = COMMON_NS ~= nil and #COMMON_NS <= NAME_MAX and #PART <= 4 and not (#PART == 4 and PART > '4095') and
  (LAYOUT ~= '' or #ARGV[3] == #PART) and (LAYOUT == '' or (#LAYOUT <= 4 and not (#LAYOUT == 4 and LAYOUT > '4096') and
    (#LAYOUT > #PART or (#LAYOUT == #PART and LAYOUT > PART))))
-- The fast paths' check (tick, claim and ack start with one: before the library's closures, see
-- LIBRARY_MARKER in scheduler/protocol/scripts.py) of what their own pattern, COMMON's with their
-- arguments after it, read: NS, P and COUNT, and ARGV[3] ('part'). COMMON's rules; true when good.
local function common_ok(ns, p, count, part)
  return ns ~= nil and #ns <= NAME_MAX and #p <= 4 and not (#p == 4 and p > '4095') and
    (count == '' and #part == #p or #count <= 4 and not (#count == 4 and count > '4096') and
      (#count > #p or (#count == #p and count > p)))
end
local refusal = nil -- the call's refusal (an error reply) once a check found a bad argument
-- One check of an argument, by kind; returns the argument as the script uses it, or records the
-- call's refusal (the first one only) and returns nil ('common' and 'refuse' return the refusal).
-- 'i': an ARGV index ('ARGV' or 'KEYS' for 'refuse' of a count). MAX_MS and MAX_INT are written
-- here as numbers, not captured: a captured local costs every call that builds this closure about
-- 0.3 k instructions, and every script builds it.
--   int i name lo hi [default]  an integer from lo to hi; with a default, absent or '' stands for it
--   num i name lo hi [above]    a (finite) number from lo to hi; above: lo itself is refused
--   name i name [optional]      a queue or cron name (validate_name); optional: '' or absent is none
--   id i                        a job id: 15 bytes
--   token i                     a lease token as claim hands it out (1 to 2^53 - 1), returned as the
--                               text it came as: it is compared with the stored text
--   flag i name                 '0' or '1' (returns false or true)
--   request_id i                a claim's request id (its receipt's key suffix): '' or 1-64 bytes
--   at i name now               run_at: epoch ms from 0 to MAX_MS, or "ESTrDELTA", due at now + DELTA
--                               by this script's clock (TIME: a producer whose clock is off fires
--                               nothing early); returns the due ms and, for a relative time, the
--                               client's estimate EST (schedule keeps it when close: its id embeds it)
--   occurrences i name n        a cron's n occurrences from ARGV[i] on: (nominal ms, fire ms) pairs,
--                               nominal ascending, fire 0 to 86400000 ms (cron.MAX_JITTER_S) after it
--   groups first name per least the number of groups of 'per' arguments from ARGV[first] on, at
--                               least 'least' (name: what a group is)
--   at_most n                   at most n arguments
--   common nkeys                names what COMMON or the count of KEYS found wrong (always refuses)
--   refuse i name expected got  refuses outright
-- Ambient: ARGV and KEYS, as it is the check of the call's arguments.
local function arg(kind, i, name, a, b, c)
  local s = ARGV[i] -- nil for 'ARGV' and 'KEYS'
  local expected
  if kind == 'int' then
    if c and (s == nil or s == '') then return c end
    local n = s and tonumber(s)
    if n and n >= a and n <= b and n % 1 == 0 then return n end
    expected = string.format('an integer from %d to %d', a, b) .. (c and ", or ''" or '')
  elseif kind == 'num' then
    local n = s and tonumber(s)
    if n and n >= a and n <= b and (n > a or not c) then return n end
    expected = (c and 'a number above ' or 'a number from ') .. tostring(a) .. ' to ' .. tostring(b)
  elseif kind == 'name' then
    if s and #s <= NAME_MAX and string.find(s, NAME_PATTERN) then return s end
    if a and (s == nil or s == '') then return '' end
    expected = (a and "'' or " or '') .. "a name of 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
  elseif kind == 'id' then
    if s and #s == 15 then return s end
    name, expected = 'id', 'a job id of 15 bytes'
  elseif kind == 'token' then
    local n = s and tonumber(s)
    if n and n >= 1 and n <= 9007199254740991 and n % 1 == 0 then return s end
    name, expected = 'token', 'a lease token (an integer from 1 to 9007199254740991)'
  elseif kind == 'at' then
    local at = s and tonumber(s)
    if at then
      if at >= 0 and at <= 253402300799999 and at % 1 == 0 then return at, nil end
    elseif s then
      local est, delta = string.match(s, '^(%d+)r(%-?%d+)$')
      est, delta = tonumber(est), tonumber(delta)
      if est and est <= 253402300799999 and a + delta >= 0 and a + delta <= 253402300799999 then return a + delta, est end
    end
    expected = 'epoch ms from 0 to 253402300799999, or "ESTrDELTA" (EST such ms, now + DELTA ms too)'
  elseif kind == 'flag' then
    if s == '0' or s == '1' then return s == '1' end
    expected = "'0' or '1'"
  elseif kind == 'request_id' then
    if s == nil or #s <= 64 then return s or '' end
    name, expected = 'request_id', "'' or a request id of 1-64 bytes"
  elseif kind == 'occurrences' then
    -- a cron's n occurrences from ARGV[i] on: (nominal ms, fire ms) pairs, nominal ascending, each
    -- fired 0 to 86400000 ms (cron.MAX_JITTER_S) after it
    local last = -1
    for b = i, i + 2 * a - 2, 2 do
      local nominal, fire = tonumber(ARGV[b] or ''), tonumber(ARGV[b + 1] or '')
      if not (nominal and nominal > last and nominal <= 253402300799999 and nominal % 1 == 0) then
        i, s, expected = b, ARGV[b], 'epoch ms up to 253402300799999, after the previous occurrence'
        break
      end
      if not (fire and fire >= nominal and fire - nominal <= 86400000 and fire % 1 == 0) then
        i, s, expected = b + 1, ARGV[b + 1], 'epoch ms from its nominal time to 86400000 ms after it'
        break
      end
      last = nominal
    end
    if expected == nil then return true end
  elseif kind == 'groups' then
    local n = (#ARGV - i + 1) / a
    if n >= b and n % 1 == 0 then return n end
    i, name, s, expected = 'ARGV', 'count', #ARGV, string.format('%d arguments, then ', i - 1) ..
      (b == 0 and 'any number' or 'one or more') .. ' of ' .. name
  elseif kind == 'at_most' then
    if #ARGV <= i then return true end
    i, name, s, expected = 'ARGV', 'count', #ARGV, string.format('at most %d arguments', i)
  elseif kind == 'common' then
    local prefix, chan, part = ARGV[1], ARGV[2], ARGV[3]
    local ns, p = string.match(prefix or '', '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:$')
    local pp, count = string.match(part or '', '^(%d+)/?(%d*)$')
    if not ns or #ns > 64 or #p > 4 or tonumber(p) > 4095 then
      i, name, s, expected = 1, 'prefix', prefix, 'a partition key prefix "{NAMESPACE:PARTITION}:" (a namespace name, ' ..
        'PARTITION from 0 to 4095)'
    elseif pp ~= p or (count == '' and #part ~= #p) or (count ~= '' and (tonumber(count) > 4096 or
        tonumber(count) <= tonumber(p))) then
      i, name, s, expected = 3, 'partition', part, '"' .. p .. '", or "' .. p .. '/COUNT" with COUNT from ' ..
        string.format('%d', p + 1) .. ' to 4096'
    elseif chan ~= prefix and chan ~= ns .. ':' then
      i, name, s, expected = 2, 'channel prefix', chan, '"' .. ns .. ':", or ARGV[1] (sharded pub/sub)'
    elseif #KEYS ~= i and not (i == 1 and #KEYS == 14) then
      name, s, expected = 'count', #KEYS, string.format('%d', i) .. (i == 1 and ' or 14' or '')
      i = 'KEYS'
    else
      i, name, s, expected = 'KEYS', 'partition keys', KEYS[1], "ARGV[1]'s partition keys, the first " .. prefix .. 't'
    end
  else -- 'refuse'
    expected, s = a, b
  end
  if refusal == nil then
    local shown = 'nothing'
    if type(s) == 'number' then
      shown = string.format('%d', s)
    elseif s then
      shown = '"' .. string.gsub(string.sub(s, 1, 40), '[^ -~]', '?') .. '"'
      if #s > 40 then shown = shown .. string.format(' (%d bytes)', #s) end
    end
    refusal = redis.error_reply('ZSCHED_ARG ' .. SCRIPT .. ' ' ..
      (type(i) == 'number' and string.format('ARGV[%d]', i) or i) .. ' ' .. name .. ': expected ' .. expected .. ', got ' ..
      shown)
  end
  if kind == 'common' or kind == 'refuse' then return refusal end
  return nil
end
-- A new job's record as codec.build_record makes it, at byte o + 1 of s (schedule passes the blob,
-- the id before it; cron_set its template): the header with attempt 0, max_attempts 1-255 and
-- only the flags F_SKIP, F_OPTS, F_KEY, F_LEASE and F_TRACE (cron occurrences are made here, not
-- sent), then exactly the sections they announce, in range (misfire grace up to 49 days, lease from
-- 100 ms to 7 days: options.MAX_GRACE_S and MAX_LEASE_S), the key section holding 'key' ('' for
-- none: no section), the trace section a W3C trace context (codec.trace_section: 25 to 255 bytes,
-- trace and span ids not all zero, the tracestate printable ASCII): a worker hands it to the
-- tracing library as a traceparent, so a bad one would break its attempts. Returns nil, or what
-- was expected. The limits are written here, not captured (a
-- captured local costs every call that builds the closure about 0.3 k instructions).
local function record_problem(s, o, key)
  local n = #s
  if n < o + 9 then return 'a job record (9 bytes or more)' end
  local a, mx, flags = string.byte(s, o + 3, o + 5)
  if a ~= 0 or mx == 0 or flags >= 64 or flags % 32 >= 16 then
    return 'a new job record: attempt 0, max_attempts 1-255, flags F_SKIP, F_OPTS, F_KEY, F_LEASE, F_TRACE only'
  end
  if flags == 0 and key == '' then return nil end
  local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(s, o + 10, o + 17)
  local pos = o + 10
  if flags % 2 == 1 then
    if n < pos + 3 or ((b1 * 256 + b2) * 256 + b3) * 256 + b4 > 4233600000 then
      return 'a record whose misfire grace is 0-4233600000 ms'
    end
    pos, b1, b2, b3, b4 = pos + 4, b5, b6, b7, b8
  end
  if flags % 16 >= 8 then
    local lease = n >= pos + 3 and ((b1 * 256 + b2) * 256 + b3) * 256 + b4
    if not lease or lease < 100 or lease > 604800000 then return 'a record whose lease is 100-604800000 ms' end
    pos = pos + 4
  end
  if flags % 8 >= 4 then
    local k = string.byte(s, pos)
    if k ~= #key or key == '' or string.sub(s, pos + 1, pos + k) ~= key then
      return 'a record whose key section is the idempotency key argument'
    end
    pos = pos + 1 + k
  elseif key ~= '' then
    return 'a record with a key section for the idempotency key argument'
  end
  if flags % 4 >= 2 then
    if n < pos + 1 then return 'a record whose options section fits' end
    local l1, l2 = string.byte(s, pos, pos + 1)
    pos = pos + 2 + l1 * 256 + l2
  end
  if flags >= 32 then
    local t = n >= pos and string.byte(s, pos) or 0
    if t < 25 or n < pos + t or string.sub(s, pos + 1, pos + 16) == string.rep('\0', 16) or
        string.sub(s, pos + 17, pos + 24) == string.rep('\0', 8) or
        string.find(string.sub(s, pos + 26, pos + t), '[^ -~]') then
      return 'a record whose trace section is a W3C trace context (trace id, span id, flags, printable tracestate)'
    end
    pos = pos + 1 + t
  end
  if n < pos - 1 then return 'a record whose sections fit in it' end
  return nil
end
