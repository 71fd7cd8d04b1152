-- schedule: create jobs (scheduled, or ready when already due).
-- KEYS: the 13 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 queue name; 5 tombstone ttl ms; 6 job count n; 7 re-send flag (1 when the
--       client sends this call again after a lost reply, else 0);
--       then n triples: blob (id(15) .. record with a 2-byte placeholder queue index), run_at ms,
--       idempotency key ('' for none).
-- Returns: the job ids in order (15 bytes each); for a key that is already live, the existing id.
-- Retry safety: ids are made by the client, so a re-sent call carries the same ids. With the
-- re-send flag, a job whose id already exists in any state (or as a tombstone) is left alone and
-- its id returned: the call is idempotent. The first send skips that check (new random ids
-- cannot exist), so the common path costs nothing extra.
-- Invariants: a new job enters exactly one state: timer set 't' (score run_at), or 'j' + ready
-- list when run_at <= now, or a 'misfired' tombstone when it is due, skip-policy and past grace.
-- An idempotency key maps to at most one live job. The owner is woken (pub/sub) only when a job
-- lands before the partition's current earliest timer.
local queue, ttl, n, resend = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
local now = now_ms()
local qb = p16(queue_index(queue))
local out, zargs, jargs, ready_ids = {}, {}, {}, {}
local head = head_score()
local earliest = nil
for i = 0, n - 1 do
  local b = 8 + i * 3
  local blob, at, key = ARGV[b], tonumber(ARGV[b + 1]), ARGV[b + 2]
  local id = string.sub(blob, 1, ID_LEN)
  local existing = false
  if resend and job_exists(id) then
    existing = id
  elseif key ~= '' then
    existing = redis.call('HGET', K_K, key)
    if not existing then redis.call('HSET', K_K, key, id) end
  end
  if existing then
    out[#out + 1] = existing
  else
    out[#out + 1] = id
    local rec = qb .. string.sub(blob, ID_LEN + 3)
    bump(K_C, 'scheduled:' .. queue)
    if at > now then
      zargs[#zargs + 1] = at
      zargs[#zargs + 1] = id .. rec
      if earliest == nil or at < earliest then earliest = at end
      bump(K_G, 's:' .. queue)
    else
      local grace = rec_opts(rec)
      if grace and now - at > grace then
        tombstone(id, 'm', now, ttl)
        release_key(id, rec)
        bump(K_C, 'misfired:' .. queue)
      else
        jargs[#jargs + 1] = id
        jargs[#jargs + 1] = jval(rec, at)
        ready_ids[#ready_ids + 1] = id
      end
    end
  end
end
if #zargs > 0 then multi('ZADD', K_T, zargs) end
if #jargs > 0 then
  multi('HSET', K_J, jargs)
  multi('LPUSH', PREFIX .. 'r:' .. queue, ready_ids)
  bump(K_C, 'fired:' .. queue, #ready_ids)
  redis.call('PUBLISH', CHAN .. 'ready:' .. queue, PART)
end
flush_bumps()
if earliest and (head == nil or earliest < head) then wake_scheduler() end
return out
