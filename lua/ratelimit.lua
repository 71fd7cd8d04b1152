-- ratelimit: take dispatch tokens for one queue from its namespace-wide token bucket.
-- Called by partition owners before a tick when the queue has jobs held back by the limit.
-- KEYS: 1 the bucket hash "{ns}:rl:QUEUE" (fields: tokens, ts, d:P demand, t:P demand time).
-- ARGV: 1 rate (jobs per second); 2 burst (max tokens); 3 partition; 4 demand (jobs this partition
--       has waiting, 0 = none); 5 refund (tokens granted earlier but not used).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): a key that is not one bucket
--   "{NAMESPACE}:rl:QUEUE" (names as validate_name), a rate outside (0, 1000000] or a burst outside
--   [1, 10000000] jobs (client settings.validate_rate), a partition outside 0-4095, a demand or
--   refund outside 0 to 2^53 - 1, more arguments.
-- Returns: {granted, ms until the next token (0 when tokens remain)}.
-- Invariants: tokens never exceed burst and never go below 0; the grant is the partition's share
-- of the tokens in proportion to its demand among partitions that asked in the last 2 s (at least
-- 1 token when one is available), so a herd spread over many partitions drains oldest-first per
-- partition and fairly across partitions at the configured rate.
-- Uses: MAX_INT, NAME_MAX, arg, fmt, refusal
local key = KEYS[1]
if #KEYS ~= 1 or not string.find(key, '^{[A-Za-z0-9][A-Za-z0-9_.%-]*}:rl:[A-Za-z0-9][A-Za-z0-9_.%-]*$') or
    #string.match(key, '^{(.-)}') > NAME_MAX or #string.match(key, ':rl:(.*)$') > NAME_MAX then
  return arg('refuse', 'KEYS', 'bucket', '1 key, the bucket "{NAMESPACE}:rl:QUEUE" (Keyspace.bucket)', table.concat(KEYS, ' '))
end
local rate, burst = arg('num', 1, 'per_second', 0, 1000000, true), arg('num', 2, 'burst', 1, 10000000)
local part, demand = arg('int', 3, 'partition', 0, 4095), arg('int', 4, 'demand', 0, MAX_INT)
local refund = arg('int', 5, 'refund', 0, MAX_INT)
arg('at_most', 5)
if refusal then return refusal end
part = fmt(part)
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
