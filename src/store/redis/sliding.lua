-- Charon: one atomic decision on Redis, for a batch of sliding windows only.
--
-- Like window.lua and gcra.lua, a script of its own for one kind: the same
-- wire, state encoding and verdict as the s chunk of the batch script
-- (kinds/sliding.lua, which documents them), and the same two call shapes
-- (window.lua says why):
--
-- * One item on one key: ARGV limit period hits shadow, and a fifth, the
--   injected time in ms, in tests only. Returns "granted clock value", as
--   window.lua does.
-- * Any batch: KEYS the window keys. ARGV[1]: "0" for Redis TIME, or an
--   injected time in ms (tests only). ARGV[2]: kind letters (all "s").
--   ARGV[3]: number of items, then per item: s slot limit period hits
--   shadow. Returns {now, granted, value before...}.
--
-- State: "start,current,previous,expires_at"; the previous window weighted
-- in 1/65536, every product under 2^53. Numbers are read and written as
-- window.lua reads and writes them (which says why).

local one = #ARGV < 6
local now, slack, clock
local injected = ARGV[one and 5 or 1]
if injected and injected ~= '0' then
  -- Virtual time: keys outlive their virtual relevance by a day.
  now, slack, clock = tonumber(injected), 86400000, injected
else
  local time = redis.call('TIME')
  now, slack = time[1] * 1000 + math.floor(time[2] / 1000), 0
  if one then
    clock = time[1] .. '.' .. time[2]
  end
end

-- A stored state as (start, current, previous): nothing once it expired.
local function read(value)
  if value then
    local s, c, p, e = string.match(value, '^(%d+),(%d+),(%d+),(%d+)$')
    if e == nil then
      error('charon: not a sliding window state: ' .. value)
    end
    if e + 0 > now then
      return s + 0, c + 0, p + 0
    end
  end
  return 0, 0, 0
end

-- The verdict on (start, current, previous) for `hits` more, and the
-- state to write when they are granted.
local function decide(start0, current0, previous0, limit, period, hits)
  local span = math.max(period, 1)
  local start = now - math.fmod(now, span)
  local current, previous = 0, 0
  if start0 == start then
    current, previous = current0, previous0
  elseif start0 + period == start then
    previous = current0
  end
  local weight = math.floor(math.max(span - (now - start), 0) * 65536 / span)
  local estimate = current + math.floor(previous * weight / 65536)
  return estimate + math.max(hits, 1) > limit, start, current + hits, previous
end

-- One item on one key: the decision of the batch below, without its tables.
if one then
  local limit, period, hits = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
  local value = redis.call('GET', KEYS[1])
  local s, c, p = read(value)
  local over, start, current, previous = decide(s, c, p, limit, period, hits)
  if not over and hits > 0 then
    redis.call('SET', KEYS[1], string.format('%d,%d,%d,%d', start, current, previous, start + 2 * period),
      'PX', start + 2 * period - now + slack)
  end
  local granted = '1 '
  if over and ARGV[4] ~= '1' then
    granted = '0 '
  end
  return granted .. clock .. ' ' .. (value or '')
end

local reply = { now, 1 }
local starts, currents, previouses, expires, dirty = {}, {}, {}, {}, {}
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  reply[i + 2] = value
  starts[i], currents[i], previouses[i] = read(value)
end

local at = 4
for _ = 1, tonumber(ARGV[3]) do
  local slot, limit, period = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local hits = tonumber(ARGV[at + 4])
  local shadow = ARGV[at + 5] == '1'
  at = at + 6
  local over, start, current, previous = decide(starts[slot], currents[slot], previouses[slot], limit, period, hits)
  if not over and hits > 0 then
    starts[slot], currents[slot], previouses[slot] = start, current, previous
    expires[slot], dirty[slot] = start + 2 * period, true
  end
  if over and not shadow then
    reply[2] = 0
    break
  end
end

if reply[2] == 1 then
  for i = 1, #KEYS do
    if dirty[i] then
      redis.call('SET', KEYS[i], string.format('%d,%d,%d,%d', starts[i], currents[i], previouses[i], expires[i]),
        'PX', expires[i] - now + slack)
    end
  end
end
return reply
