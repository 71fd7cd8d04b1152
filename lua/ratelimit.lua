-- ratelimit: take dispatch tokens for one queue from its namespace-wide token bucket.
-- Called by partition owners before a tick when the queue has jobs held back by the limit.
-- KEYS: 1 the bucket hash "{ns}:rl:QUEUE" (fields: tokens, ts, d:P demand, t:P demand time).
-- ARGV: 1 rate (jobs per second); 2 burst (max tokens); 3 partition; 4 demand (jobs this partition
--       has waiting, 0 = none); 5 refund (tokens granted earlier but not used).
-- Returns: {granted, ms until the next token (0 when tokens remain)}.
-- Invariants: tokens never exceed burst and never go below 0; the grant is the partition's share
-- of the tokens in proportion to its demand among partitions that asked in the last 2 s (at least
-- 1 token when one is available), so a herd spread over many partitions drains oldest-first per
-- partition and fairly across partitions at the configured rate.
local key = KEYS[1]
local rate, burst, part, demand, refund = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', key, 'tokens', 'ts')
local tokens = tonumber(h[1] or burst)
local ts = tonumber(h[2] or now)
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000 + refund)
if demand > 0 then
  redis.call('HSET', key, 'd:' .. part, demand, 't:' .. part, now)
else
  redis.call('HDEL', key, 'd:' .. part, 't:' .. part)
end
local grant = 0
if demand > 0 and tokens >= 1 then
  local total = 0
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 't:' and now - tonumber(all[i + 1]) > 2000 then
      redis.call('HDEL', key, f, 'd:' .. string.sub(f, 3))
    elseif string.sub(f, 1, 2) == 'd:' then
      total = total + tonumber(all[i + 1])
    end
  end
  local share = math.floor(tokens * demand / math.max(total, demand))
  grant = math.min(demand, math.floor(tokens), math.max(1, share))
  tokens = tokens - grant
end
redis.call('HSET', key, 'tokens', tostring(tokens), 'ts', now)
redis.call('PEXPIRE', key, 3600000)
local wait = 0
if tokens < 1 then wait = math.ceil((1 - tokens) * 1000 / rate) end
return {grant, wait}
