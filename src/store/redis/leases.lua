-- Capacity leases on Redis (docs/design.md#capacity-leases): the state of
-- one leased capacity is one value (every client's lease, JSON), decided by
-- the engine in the sidecar and written back only if nobody wrote it in
-- between (compare and set), so each apportioning step is atomic.
--
-- KEYS[1]: the state. ARGV[1]: the operation.
-- load: -> { state or '', now in ms by Redis's clock }
-- store: ARGV[2] the state read ('' when there was none), ARGV[3] the new
--   state ('' to delete), ARGV[4] its time to live in ms -> 1, or 0 when the
--   state changed since it was read.

local key, op = KEYS[1], ARGV[1]

if op == 'load' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  return { redis.call('GET', key) or '', now }
end

if op == 'store' then
  local current = redis.call('GET', key) or ''
  if current ~= ARGV[2] then
    return 0
  end
  if ARGV[3] == '' then
    redis.call('DEL', key)
  else
    redis.call('SET', key, ARGV[3], 'PX', ARGV[4])
  end
  return 1
end

return redis.error_reply('unknown operation ' .. tostring(op))
