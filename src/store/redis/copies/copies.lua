-- Charon's copy log for one copy-limited resource (docs/design.md#copy-limits,
-- docs/design.md#sidecar-crashes).
--
-- `counts` holds the resource's holds; every session keeps its own share of
-- them in a `contribution` named `<sidecar id>.<session number>`, changed in
-- the same call, so that a session's end subtracts exactly what the log
-- recorded for it (even after a call whose answer was lost to a timeout), and
-- when a sidecar dies the reaper subtracts exactly its sessions' holds.
-- Staged transfers are counted in `counts` but belong to no session. Fields: `g` (all domains),
-- `d:<domain>`, `p:<group>`. Every key shares one hash tag: each call is
-- atomic, on Redis and on a Redis Cluster alike.
--
-- KEYS: 1 counts, 2 contributors (SET), 3 reaped (ZSET), 4 transfers (ZSET
-- by expiry), 5 staged (HASH secret -> JSON), 6 a session's contribution;
-- for 'reserve', 7 the domain's count of work done (a number).
-- ARGV[1] is the operation. Replies are arrays whose first element is a
-- status: 'ok', 'resigned' (this sidecar was reaped: it must resign) or
-- 'unknown' (no such transfer).

local counts, contributors, reaped, transfers, staged, contribution =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op = ARGV[1]

local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function num(value)
  return tonumber(value) or 0
end

-- The fields a hold of `domain` in `groups` counts in.
local function fields(domain, groups)
  local list = { 'g', 'd:' .. domain }
  for _, group in ipairs(groups) do
    list[#list + 1] = 'p:' .. group
  end
  return list
end

local function add(key, list, n)
  for _, field in ipairs(list) do
    redis.call('HINCRBY', key, field, n)
  end
end

-- Subtracts n from every field, never below zero; empty fields are dropped.
local function sub(key, list, n)
  for _, field in ipairs(list) do
    local left = num(redis.call('HGET', key, field)) - n
    if left > 0 then
      redis.call('HSET', key, field, left)
    else
      redis.call('HDEL', key, field)
    end
  end
end

-- ARGV[from] = n, then n strings.
local function strings(from)
  local n = tonumber(ARGV[from])
  local list = {}
  for i = 1, n do
    list[i] = ARGV[from + i]
  end
  return list, from + n + 1
end

-- 'ok' and the holds of the domain, of all domains, and of each group.
local function context(domain, groups)
  local reply = { 'ok', num(redis.call('HGET', counts, 'd:' .. domain)), num(redis.call('HGET', counts, 'g')) }
  for _, group in ipairs(groups) do
    reply[#reply + 1] = num(redis.call('HGET', counts, 'p:' .. group))
  end
  return reply
end

local function is_reaped(server)
  return redis.call('ZSCORE', reaped, server) ~= false
end

-- A staged transfer goes back to the free pool.
local function unstage(secret, record)
  local hold = cjson.decode(record)
  sub(counts, fields(hold.d, hold.g), tonumber(hold.c))
  redis.call('HDEL', staged, secret)
  redis.call('ZREM', transfers, secret)
end

-- The smallest number of copies the contribution holds over `list`.
local function contributed(list)
  local least = nil
  for _, field in ipairs(list) do
    local held = math.min(num(redis.call('HGET', contribution, field)), num(redis.call('HGET', counts, field)))
    if least == nil or held < least then
      least = held
    end
  end
  return least or 0
end

if op == 'reserve' then
  -- contributor, sidecar, domain, copies, min, domain limit (-1: none),
  -- global limit (-1: none), then the groups as n, names..., n, limits...,
  -- then the count of work done to answer 'done' past (-1: none).
  local contributor, server, domain = ARGV[2], ARGV[3], ARGV[4]
  local copies, min = tonumber(ARGV[5]), tonumber(ARGV[6])
  local domain_limit, global_limit = tonumber(ARGV[7]), tonumber(ARGV[8])
  local groups, next = strings(9)
  local limits, after = strings(next)
  local done_past = tonumber(ARGV[after]) or -1
  if is_reaped(server) then
    return { 'resigned' }
  end
  -- A waiter for anyone's result: work released as done since it began
  -- waiting answers it, in the same step as the grant, so that a copy
  -- released as done is never taken by one who should read the result.
  if done_past >= 0 and num(redis.call('GET', KEYS[7])) > done_past then
    return { 'done' }
  end
  local before = context(domain, groups)
  local room = copies
  if domain_limit >= 0 then
    room = math.min(room, domain_limit - before[2])
  end
  if global_limit >= 0 then
    room = math.min(room, global_limit - before[3])
  end
  for i = 1, #groups do
    room = math.min(room, tonumber(limits[i]) - before[3 + i])
  end
  if room < min or room < 1 then
    room = 0
  else
    local list = fields(domain, groups)
    add(counts, list, room)
    add(contribution, list, room)
    redis.call('SADD', contributors, contributor)
  end
  before[1] = room
  return before
elseif op == 'release' or op == 'transfer' then
  -- contributor, domain, copies, the hold's groups, the domain's groups now
  -- (for the answer's context); transfer: then secret, ttl ms.
  local contributor, domain, copies = ARGV[2], ARGV[3], tonumber(ARGV[4])
  local groups, next = strings(5)
  local now_groups, after = strings(next)
  local list = fields(domain, groups)
  -- Never more than this session contributed: a release after its holds
  -- were reaped (or the store lost them, or a retry of a release that did
  -- happen) must not take other sessions' copies.
  local moved = math.min(copies, contributed(list))
  sub(contribution, list, moved)
  if redis.call('EXISTS', contribution) == 0 then
    redis.call('SREM', contributors, contributor)
  end
  local expires = 0
  if op == 'release' then
    sub(counts, list, moved)
  elseif moved > 0 then
    local secret, ttl = ARGV[after], tonumber(ARGV[after + 1])
    expires = now_ms() + ttl
    redis.call('HSET', staged, secret, cjson.encode({ d = domain, g = groups, c = moved }))
    redis.call('ZADD', transfers, expires, secret)
  end
  local reply = context(domain, now_groups)
  reply[#reply + 1] = moved
  reply[#reply + 1] = expires
  return reply
elseif op == 'seize' then
  -- contributor, sidecar, secret
  local contributor, server, secret = ARGV[2], ARGV[3], ARGV[4]
  if is_reaped(server) then
    return { 'resigned' }
  end
  local record = redis.call('HGET', staged, secret)
  if not record then
    return { 'unknown' }
  end
  local expires = redis.call('ZSCORE', transfers, secret)
  if not expires or tonumber(expires) <= now_ms() then
    unstage(secret, record)
    return { 'unknown' }
  end
  local hold = cjson.decode(record)
  add(contribution, fields(hold.d, hold.g), tonumber(hold.c))
  redis.call('SADD', contributors, contributor)
  redis.call('HDEL', staged, secret)
  redis.call('ZREM', transfers, secret)
  local reply = { 'ok', hold.d, tonumber(hold.c) }
  for _, group in ipairs(hold.g) do
    reply[#reply + 1] = group
  end
  return reply
elseif op == 'counts' then
  -- domain, groups
  local groups = strings(3)
  return context(ARGV[2], groups)
elseif op == 'expire' then
  -- Unstages every transfer past its expiry (at most 1000 per call).
  local due = redis.call('ZRANGEBYSCORE', transfers, '-inf', now_ms(), 'LIMIT', 0, 1000)
  for _, secret in ipairs(due) do
    local record = redis.call('HGET', staged, secret)
    if record then
      unstage(secret, record)
    else
      redis.call('ZREM', transfers, secret)
    end
  end
  return { 'ok', #due }
elseif op == 'reap' or op == 'drop' then
  -- contributor, sidecar. Subtracts the contribution: 'drop' at the end of a
  -- session, 'reap' for a dead sidecar's session, which also bars the
  -- sidecar from contributing again (one that outlived its heartbeat must
  -- not add holds that nobody would ever reap).
  local contributor, server = ARGV[2], ARGV[3]
  if op == 'reap' then
    local now = now_ms()
    redis.call('ZADD', reaped, now, server)
    redis.call('ZREMRANGEBYSCORE', reaped, '-inf', now - 86400000)
    redis.call('PEXPIRE', reaped, 172800000)
  end
  local held = redis.call('HGETALL', contribution)
  local total = 0
  for i = 1, #held, 2 do
    local field, n = held[i], tonumber(held[i + 1])
    sub(counts, { field }, n)
    if field == 'g' then
      total = n
    end
  end
  redis.call('DEL', contribution)
  redis.call('SREM', contributors, contributor)
  return { 'ok', total }
end
return redis.error_reply('charon copies: unknown operation ' .. tostring(op))
