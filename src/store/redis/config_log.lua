-- The configuration API's log on Redis (docs/configuration-api.md). Every
-- key shares one hash tag: each call is atomic, on a Redis Cluster too.
--
-- KEYS: 1 version (the last change's), 2 objects (HASH key -> JSON object),
-- 3 log (LIST of JSON changes, oldest first, consecutive versions).
-- ARGV[1] is the operation.

local version_key, objects, log = KEYS[1], KEYS[2], KEYS[3]
local op = ARGV[1]

local function current_version()
  return tonumber(redis.call('GET', version_key)) or 0
end

if op == 'write' then
  -- ARGV: key, path (JSON), expected version ('' for any), has body ('1'),
  -- body, who, how many changes to keep.
  local key, path, expect, has_body, body, who, keep =
    ARGV[2], ARGV[3], ARGV[4], ARGV[5] == '1', ARGV[6], ARGV[7], tonumber(ARGV[8])
  local stored = redis.call('HGET', objects, key)
  local at = 0
  if stored then
    at = tonumber(cjson.decode(stored).version)
  end
  if expect ~= '' and tonumber(expect) ~= at then
    return { 'stale', at }
  end
  if not has_body and not stored then
    return { 'missing' }
  end
  local version = redis.call('INCR', version_key)
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local decoded_path = cjson.decode(path)
  if has_body then
    redis.call('HSET', objects, key,
      cjson.encode({ version = version, path = decoded_path, body = body }))
  else
    redis.call('HDEL', objects, key)
  end
  local change = cjson.encode({
    version = version, at_ms = now, who = who, path = decoded_path,
    body = has_body and body or cjson.null,
  })
  redis.call('RPUSH', log, change)
  local excess = redis.call('LLEN', log) - keep
  if excess > 0 then
    redis.call('LTRIM', log, excess, -1)
  end
  return { 'ok', change }
end

if op == 'version' then
  return current_version()
end

if op == 'snapshot' then
  local reply = { current_version() }
  for _, object in ipairs(redis.call('HVALS', objects)) do
    reply[#reply + 1] = object
  end
  return reply
end

if op == 'since' then
  -- ARGV[2]: the version the caller has. The changes after it, or
  -- 'snapshot' when the log no longer holds them all.
  local have = tonumber(ARGV[2])
  local latest = current_version()
  if have >= latest then
    return { 'changes' }
  end
  local first = redis.call('LINDEX', log, 0)
  if not first then
    return { 'snapshot' }
  end
  local oldest = tonumber(cjson.decode(first).version)
  if have + 1 < oldest then
    return { 'snapshot' }
  end
  local reply = { 'changes' }
  for _, change in ipairs(redis.call('LRANGE', log, have + 1 - oldest, -1)) do
    reply[#reply + 1] = change
  end
  return reply
end

return redis.error_reply('unknown operation ' .. tostring(op))
