-- Recorded use (docs/design.md#learning-a-limit); every key of one
-- namespace shares one hash tag.
--
-- record: KEYS[1] the namespace's subjects (a sorted set: subject -> the
--   start of its last window), KEYS[2..] one window key per subject.
--   ARGV: 'record', window start, retention ms, domains per window,
--   subjects at most, then per window key: its subject, n, and n pairs
--   of domain and hits. A domain not in a full window replaces the
--   lightest and inherits its count (Space-Saving). Returns how many
--   subjects were not recorded (past the bound).
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
local subjects = KEYS[1]
redis.call('ZREMRANGEBYSCORE', subjects, '-inf', '(' .. (start - retention))

local refused = 0
local at = 6
for k = 2, #KEYS do
  local key = KEYS[k]
  local subject = ARGV[at]
  local n = tonumber(ARGV[at + 1])
  at = at + 2
  local known = redis.call('ZSCORE', subjects, subject)
  if known or redis.call('ZCARD', subjects) < most then
    redis.call('ZADD', subjects, start, subject)
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
redis.call('PEXPIRE', subjects, retention)
return refused
