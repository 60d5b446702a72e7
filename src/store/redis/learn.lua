-- Recorded use (docs/design.md#learning-a-limit); every key of one
-- namespace shares one hash tag.
--
-- record: KEYS[1] the namespace's resources (a sorted set: resource -> the
--   start of its last window), KEYS[2..] one window key per resource.
--   ARGV: 'record', window start, retention ms, domains per window,
--   resources at most, then per window key: its resource, n, and n pairs
--   of domain and hits. A domain not in a full window replaces the
--   lightest and inherits its count (Space-Saving). Returns how many
--   resources were not recorded (past the bound).
-- read: KEYS: window keys. Returns, per key, its domains and hits.

if ARGV[1] == 'read' then
  local out = {}
  for i = 1, #KEYS do
    out[i] = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
  end
  return out
end

local start = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local most = tonumber(ARGV[5])
local resources = KEYS[1]
redis.call('ZREMRANGEBYSCORE', resources, '-inf', '(' .. (start - retention))

local refused = 0
local at = 6
for k = 2, #KEYS do
  local key = KEYS[k]
  local resource = ARGV[at]
  local n = tonumber(ARGV[at + 1])
  at = at + 2
  local known = redis.call('ZSCORE', resources, resource)
  if known or redis.call('ZCARD', resources) < most then
    redis.call('ZADD', resources, start, resource)
    for i = 0, n - 1 do
      local domain = ARGV[at + 2 * i]
      local hits = tonumber(ARGV[at + 2 * i + 1])
      if redis.call('ZSCORE', key, domain) then
        redis.call('ZINCRBY', key, hits, domain)
      elseif redis.call('ZCARD', key) < capacity then
        redis.call('ZADD', key, hits, domain)
      else
        local lightest = redis.call('ZPOPMIN', key)
        redis.call('ZADD', key, tonumber(lightest[2]) + hits, domain)
      end
    end
    redis.call('PEXPIRE', key, retention)
  else
    refused = refused + 1
  end
  at = at + 2 * n
end
redis.call('PEXPIRE', resources, retention)
return refused
