-- list: one page of a partition's jobs of one queue in one state (no state change; used by
-- jobs() and `zsched job list`).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 state: 'scheduled', 'ready', 'running' or 'dead'; 5 queue name; 6 limit
--       (at most this many jobs); 7 position ('' = from the start, else a position this script
--       returned for the same state and queue); 8 scan budget: examine at most this many entries;
--       9, 10 (optional, 'scheduled' only): run_at range, inclusive epoch ms from / to ('' = open
--       end). Both of the state's sets are scored by run_at (due time for 'h'), so the range is
--       pushed into the read: the walk starts at the first member at or after 'from' and stops at
--       the last at or before 'to' (ranks by ZCOUNT, O(log n)); the budget is spent only inside it.
-- Returns: {next position, or '' when this partition has nothing more; then 6 values per job:
--          id, record, score, token or false, error or false, due ms}. score as in inspect (run_at,
--          due time, lease deadline, time of death); token: running jobs' fence, and 'h' for a
--          scheduled job held by its queue's rate limit (the 'h' phase below). Fewer than
--          'limit' jobs with a non-empty position means the budget ran out (timers of every queue
--          share the set 't'; running and dead jobs of every queue share 'i' and 'd'): call again
--          from the position.
-- Order and positions (opaque to callers):
--   scheduled: the queue's due jobs held by its rate limit ('h:QUEUE', by due time) first, then
--              the timer set 't' (by run_at): 'h' or 't' .. score .. ',' .. id.
--   ready:     the ready list from the job claimed next (its tail): 'r' .. n .. ',' .. id, n jobs
--              listed, the last being id. Claims between pages shift the list: id is looked for
--              again (LINDEX, else LPOS bounded by n + budget); when it is gone it was claimed,
--              and so was every job listed before it, so listing goes on from the tail.
--   running:   the in-flight set 'i' by lease deadline: 'i' .. score .. ',' .. id.
--   dead:      the dead set 'd' by time of death, oldest first: 'd' .. score .. ',' .. id.
-- Sorted-set positions are exclusive (score, id) pairs, found again by binary search (O(log n)):
-- a job that stays where it is is listed exactly once across pages, a job that moves between
-- pages (fired, claimed, retried, extended) may be missed or listed again in its new place.
-- Work per call: O(log n) to find the position (and the range's ends), then at most 'budget' entries.
-- Refuses (ZSCHED_ARG; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, an unknown state, a
--   queue that is not a queue name, a limit outside 1-1000 (listing.LIST_MAX_LIMIT), a position
--   this script did not return for the state, a budget outside 1 to 2^53 - 1, a run_at_from or
--   run_at_to that is neither '' nor epoch ms up to 9999-12-31, a run_at range for a state other
--   than scheduled, more arguments.
-- Invariants: read-only (no key is written); examines at most ARGV[8] entries per call.
-- Uses: COMMON, ID_LEN, K_D, K_E, K_I, K_J, K_L, K_META, K_Q, K_T, LAYOUT, MAX_INT, MAX_MS, PREFIX,
--       arg, fmt, id_less, layout_fence, rec_qidx, refusal, u48
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local state, queue, pos = ARGV[4], arg('name', 5, 'queue'), ARGV[7]
local limit, budget = arg('int', 6, 'limit', 1, 1000), arg('int', 8, 'budget', 1, MAX_INT)
local from, to = arg('int', 9, 'run_at_from', 0, MAX_MS, -1), arg('int', 10, 'run_at_to', 0, MAX_MS, -1)
arg('at_most', 10)
local want = ({scheduled = 'ht', ready = 'r', running = 'i', dead = 'd'})[state]
if not want then arg('refuse', 4, 'state', "'scheduled', 'ready', 'running' or 'dead'", state) end
if want and want ~= 'ht' and (from ~= -1 or to ~= -1) then
  arg('refuse', from ~= -1 and 9 or 10, from ~= -1 and 'run_at_from' or 'run_at_to', "'' (a run_at range is for state " ..
    "scheduled only)", ARGV[from ~= -1 and 9 or 10])
end
-- a position this script returned: '' (the start), or the phase letter, then the last (score, id)
-- listed ("SCORE,ID") or, for the ready list, the count listed and the last id
local phase, from_score, from_id = nil, nil, nil
if pos and pos ~= '' then
  phase = string.sub(pos, 1, 1)
  if #pos > 1 then from_score, from_id = string.match(pos, '^.(%d+),(' .. string.rep('.', ID_LEN) .. ')$') end
  if not (want and string.find(want, phase, 1, true)) or (#pos > 1 and not from_score) then
    arg('refuse', 7, 'position', "'' or a position this script returned for this state", pos)
  end
elseif not pos then
  arg('refuse', 7, 'position', "'' or a position this script returned for this state", pos)
end
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
if budget < limit then budget = limit end
local rmin, rmax = from ~= -1 and fmt(from) or '', to ~= -1 and fmt(to) or ''
local out = {''}
local qidx = tonumber(redis.call('HGET', K_Q, 'n:' .. queue) or '0')
if qidx == 0 then return out end -- this partition never had a job of the queue
local found, examined = 0, 0

local function add(id, rec, score, token, due)
  out[#out + 1] = id; out[#out + 1] = rec; out[#out + 1] = score
  out[#out + 1] = token; out[#out + 1] = redis.call('HGET', K_E, id) or false; out[#out + 1] = fmt(due)
  found = found + 1
end

-- First rank after (score, id) in a sorted set whose members start with a 15-byte id.
local function rank_after(key, score, id)
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  local a, b = lo, lo + redis.call('ZCOUNT', key, score, score)
  while a < b do
    local mid = math.floor((a + b) / 2)
    local m = redis.call('ZRANGE', key, mid, mid)[1]
    if id_less(id, string.sub(m, 1, ID_LEN)) then b = mid else a = mid + 1 end
  end
  return a
end

-- Walk a sorted set from after (score, id), calling keep(member, score) per entry, until the page
-- is full or the budget is spent, within the run_at range (rmin, rmax) when one is given. Returns
-- the last (score, id) examined (nil if none) and whether the set (or range) was exhausted.
local function walk(key, score, id, keep)
  local r = score and rank_after(key, score, id) or 0
  if rmin ~= '' then r = math.max(r, redis.call('ZCOUNT', key, '-inf', '(' .. rmin)) end
  local stop = rmax ~= '' and redis.call('ZCOUNT', key, '-inf', rmax) or nil -- first rank past the range
  local ls, lid = nil, nil
  while found < limit and examined < budget do
    local n = math.min(200, budget - examined)
    if stop then
      n = math.min(n, stop - r)
      if n <= 0 then return ls, lid, true end
    end
    local chunk = redis.call('ZRANGE', key, r, r + n - 1, 'WITHSCORES')
    for i = 1, #chunk, 2 do
      examined = examined + 1
      ls, lid = chunk[i + 1], string.sub(chunk[i], 1, ID_LEN)
      keep(chunk[i], chunk[i + 1])
      if found >= limit and i + 1 < #chunk then return ls, lid, false end
    end
    if #chunk < 2 * n then return ls, lid, true end
    r = r + n
    if stop and r >= stop then return ls, lid, true end
  end
  return ls, lid, false
end

local function body_keep(with_token, filter, mark)
  return function(id, score)
    local v = redis.call('HGET', K_J, id)
    if not v then return end
    local rec = string.sub(v, 7)
    if filter and rec_qidx(rec) ~= qidx then return end
    add(id, rec, score, mark or (with_token and (redis.call('HGET', K_L, id) or false)) or false, u48(v, 1))
  end
end

local function finish(p, ls, lid, done, next_phase)
  if done then return next_phase end
  if ls then out[1] = p .. ls .. ',' .. lid else out[1] = p .. (from_score and (from_score .. ',' .. from_id) or '') end
  return nil
end

if state == 'scheduled' then
  phase = phase or 'h'
  if phase == 'h' then
    local ls, lid, done = walk(PREFIX .. 'h:' .. queue, from_score, from_id, body_keep(false, false, 'h'))
    if not finish('h', ls, lid, done, 't') then return out end
    phase, from_score, from_id = 't', nil, nil
  end
  local ls, lid, done = walk(K_T, from_score, from_id, function(member, score)
    local rec = string.sub(member, ID_LEN + 1)
    if rec_qidx(rec) == qidx then add(string.sub(member, 1, ID_LEN), rec, score, false, tonumber(score)) end
  end)
  finish('t', ls, lid, done, '')
elseif state == 'running' or state == 'dead' then
  local key = state == 'running' and K_I or K_D
  local ls, lid, done = walk(key, from_score, from_id, body_keep(state == 'running', true))
  finish(want, ls, lid, done, '')
else
  local key = PREFIX .. 'r:' .. queue
  local n = 0
  if from_score then
    n = tonumber(from_score)
    if n < 1 or redis.call('LINDEX', key, -n) ~= from_id then
      local idx = redis.call('LPOS', key, from_id, 'RANK', -1, 'MAXLEN', math.max(n, 0) + budget)
      if idx then n = redis.call('LLEN', key) - idx else n = 0 end
    end
  end
  local ids = redis.call('LRANGE', key, -(n + limit), -(n + 1))
  for k = #ids, 1, -1 do
    local v = redis.call('HGET', K_J, ids[k])
    if v then add(ids[k], string.sub(v, 7), fmt(u48(v, 1)), false, u48(v, 1)) end
  end
  if #ids >= limit then out[1] = 'r' .. fmt(n + #ids) .. ',' .. ids[1] end
end
return out
