-- Charon: one atomic decision on Redis, for a batch of calendar windows only.
--
-- Like window.lua, a script of its own for one kind: the same wire, state
-- encoding and verdict as the d chunk of the batch script
-- (kinds/calendar.lua, which documents them: the sidecar sends three
-- windows' boundaries and Redis TIME picks one), and the same two call
-- shapes (window.lua says why):
--
-- * One item on one key: ARGV limit b0 b1 b2 b3 hits shadow, and an eighth,
--   the injected time in ms, in tests only. Returns "granted clock value",
--   as window.lua does.
-- * Any batch: KEYS the window keys. ARGV[1]: "0" for Redis TIME, or an
--   injected time in ms (tests only). ARGV[2]: kind letters (all "w").
--   ARGV[3]: number of items, then per item: d slot limit b0 b1 b2 b3 hits
--   shadow. Returns {now, granted, value before...}.
--
-- State: a fixed window's, "start,count,expires_at", the key expiring at
-- the window's end (spread as window.lua spreads it). Numbers are read and
-- written as window.lua reads and writes them (which says why).

local one = #ARGV < 9
local now, slack, spread, clock
local injected = ARGV[one and 8 or 1]
if injected and injected ~= '0' then
  -- Virtual time: keys outlive their virtual relevance by a day.
  now, slack, spread, clock = tonumber(injected), 86400000, 0, injected
else
  local time = redis.call('TIME')
  local micros = time[2] + 0
  now, slack = time[1] * 1000 + math.floor(micros / 1000), 0
  spread = math.fmod(micros, 1000) / 1000
  if one then
    clock = time[1] .. '.' .. time[2]
  end
end

-- The start of the window of now, and its end (as CalendarItem::window_at).
local function window_at(b0, b1, b2, b3)
  if now < b1 then
    return b0, b1
  elseif now < b2 then
    return b1, b2
  end
  return b2, b3
end

-- A stored state as (start, count): nothing once it expired.
local function read(value)
  if value then
    local s, c, e = string.match(value, '^(%d+),(%d+),(%d+)$')
    if e == nil then
      error('charon: not a window state: ' .. value)
    end
    if e + 0 > now then
      return s + 0, c + 0
    end
  end
  return 0, 0
end

-- The TTL of a window key written now, for the window [start, finish).
local function window_ttl(start, finish)
  return finish - now + slack + math.floor(spread * math.min(finish - start, 60000))
end

-- One item on one key: the decision of the batch below, without its tables.
if one then
  local limit = ARGV[1] + 0
  local start, finish = window_at(ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0, ARGV[5] + 0)
  local hits = ARGV[6] + 0
  local value = redis.call('GET', KEYS[1])
  local s, c = read(value)
  local count = 0
  if s == start then
    count = c
  end
  local over = count + math.max(hits, 1) > limit
  if hits > 0 and not over then
    local state = string.format('%d,%d,%d', start, count + hits, finish)
    if s == start then
      redis.call('SET', KEYS[1], state, 'KEEPTTL')
    else
      redis.call('SET', KEYS[1], state, 'PX', window_ttl(start, finish))
    end
  end
  local granted = '1 '
  if over and ARGV[7] ~= '1' then
    granted = '0 '
  end
  return granted .. clock .. ' ' .. (value or '')
end

local reply = { now, 1 }
local starts, counts, finishes, original, dirty = {}, {}, {}, {}, {}
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  reply[i + 2] = value
  starts[i], counts[i] = read(value)
  original[i] = starts[i]
end

local at = 4
for _ = 1, tonumber(ARGV[3]) do
  local slot, limit = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local start, finish = window_at(tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]),
    tonumber(ARGV[at + 6]))
  local hits, shadow = tonumber(ARGV[at + 7]), ARGV[at + 8] == '1'
  at = at + 9
  local count = 0
  if starts[slot] == start then
    count = counts[slot]
  end
  local over = count + math.max(hits, 1) > limit
  if hits > 0 and not over then
    starts[slot], counts[slot], finishes[slot], dirty[slot] = start, count + hits, finish, true
  end
  if over and not shadow then
    reply[2] = 0
    break
  end
end

if reply[2] == 1 then
  for i = 1, #KEYS do
    if dirty[i] then
      local state = string.format('%d,%d,%d', starts[i], counts[i], finishes[i])
      if original[i] == starts[i] then
        redis.call('SET', KEYS[i], state, 'KEEPTTL')
      else
        redis.call('SET', KEYS[i], state, 'PX', window_ttl(starts[i], finishes[i]))
      end
    end
  end
end
return reply
