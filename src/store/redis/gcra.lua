-- Charon: one atomic decision on Redis, for a batch of GCRA buckets only.
--
-- Like window.lua, a script of its own for one common kind: the same wire,
-- state encoding and verdict as the a chunk of the batch script
-- (kinds/gcra.lua, which documents them, and why time is counted in ticks
-- of 1/count ms), and the
-- same three call shapes (window.lua says why):
--
-- * One item on one key: ARGV count period burst hits shadow, and a sixth,
--   the injected time in ms, in tests only. Returns "granted clock value",
--   as window.lua does.
-- * Any batch: KEYS the bucket keys. ARGV[1]: "0" for Redis TIME, or an
--   injected time in ms (tests only). ARGV[2]: kind letters (all "a").
--   ARGV[3]: number of items, then per item: a slot count period burst hits
--   shadow. Returns {now, granted, value before...}.
-- * Single decisions queued on one key, each with its own verdict (below).
--
-- State: "tat_ms,ticks,count". Numbers are read and written as window.lua
-- reads and writes them (which says why).

local one = #ARGV < 7
local now, slack, clock
local injected = ARGV[one and 6 or 1]
if injected and injected ~= '0' then
  -- Virtual time: keys outlive their virtual relevance by a day.
  now, slack, clock = tonumber(injected), 86400000, injected
else
  local time = redis.call('TIME')
  now, slack = time[1] * 1000 + math.floor(time[2] / 1000), 0
  if one or ARGV[2] == 'q' then
    clock = time[1] .. '.' .. time[2]
  end
end

-- One item on one key: the decision of the batch below, without its tables.
if one then
  local count, period, burst = ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0
  local hits = ARGV[4] + 0
  local value = redis.call('GET', KEYS[1])
  local tat, ticks, stored = 0, 0, -1
  if value then
    local ms, t, c = string.match(value, '^(%d+),(%d+),(%d+)$')
    if c == nil then
      error('charon: not a bucket state: ' .. value)
    end
    tat, ticks, stored = ms + 0, t + 0, c + 0
  end
  local over = true
  if count ~= 0 and period ~= 0 then
    local ahead = 0
    if stored == count then
      ahead = math.max(0, (tat - now) * count + ticks)
    end
    local next = ahead + math.max(hits, 1) * period
    over = next > burst * period
    if not over and hits > 0 then
      local rest = math.fmod(next, count)
      tat = now + (next - rest) / count
      local until_ms = tat - now
      if rest > 0 then
        until_ms = until_ms + 1
      end
      redis.call('SET', KEYS[1], string.format('%d,%d,%d', tat, rest, count), 'PX', math.max(until_ms, 1) + slack)
    end
  end
  local granted = '1 '
  if over and ARGV[5] ~= '1' then
    granted = '0 '
  end
  return granted .. clock .. ' ' .. (value or '')
end

-- Decisions queued on one key behind a call in flight (a hot key), as
-- window.lua's queue form: ARGV[1] "0" or an injected time, ARGV[2] "q",
-- then per decision: count period burst hits shadow. Each is decided in
-- turn at one instant, as the one-item path would decide them one after
-- another; returns "verdicts clock value", a 1 or 0 per decision.
if ARGV[2] == 'q' then
  local value = redis.call('GET', KEYS[1])
  local tat, ticks, stored = 0, 0, -1
  if value then
    local ms, t, c = string.match(value, '^(%d+),(%d+),(%d+)$')
    if c == nil then
      error('charon: not a bucket state: ' .. value)
    end
    tat, ticks, stored = ms + 0, t + 0, c + 0
  end
  local verdicts, dirty = {}, false
  for at = 3, #ARGV, 5 do
    local count, period, burst, hits = ARGV[at] + 0, ARGV[at + 1] + 0, ARGV[at + 2] + 0, ARGV[at + 3] + 0
    local over = true
    if count ~= 0 and period ~= 0 then
      local ahead = 0
      if stored == count then
        ahead = math.max(0, (tat - now) * count + ticks)
      end
      local next = ahead + math.max(hits, 1) * period
      over = next > burst * period
      if not over and hits > 0 then
        local rest = math.fmod(next, count)
        tat, ticks, stored, dirty = now + (next - rest) / count, rest, count, true
      end
    end
    if over and ARGV[at + 4] ~= '1' then
      verdicts[#verdicts + 1] = '0'
    else
      verdicts[#verdicts + 1] = '1'
    end
  end
  if dirty then
    local until_ms = tat - now
    if ticks > 0 then
      until_ms = until_ms + 1
    end
    redis.call('SET', KEYS[1], string.format('%d,%d,%d', tat, ticks, stored), 'PX', math.max(until_ms, 1) + slack)
  end
  return table.concat(verdicts) .. ' ' .. clock .. ' ' .. (value or '')
end

local reply = { now, 1 }
local tats, ticks, counts, dirty = {}, {}, {}, {}
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  reply[i + 2] = value
  if value then
    local ms, t, c = string.match(value, '^(%d+),(%d+),(%d+)$')
    if c == nil then
      error('charon: not a bucket state: ' .. value)
    end
    tats[i], ticks[i], counts[i] = tonumber(ms), tonumber(t), tonumber(c)
  else
    tats[i], ticks[i], counts[i] = 0, 0, -1
  end
end

local at = 4
for _ = 1, tonumber(ARGV[3]) do
  local slot, count, period = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local burst, hits = tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
  local shadow = ARGV[at + 6] == '1'
  at = at + 7
  local over = true
  if count ~= 0 and period ~= 0 then
    -- Ticks from now to the TAT (0 if it has passed or is of another rate).
    local ahead = 0
    if counts[slot] == count then
      ahead = math.max(0, (tats[slot] - now) * count + ticks[slot])
    end
    local next = ahead + math.max(hits, 1) * period
    over = next > burst * period
    if not over and hits > 0 then
      local rest = math.fmod(next, count)
      tats[slot], ticks[slot], counts[slot] = now + (next - rest) / count, rest, count
      dirty[slot] = true
    end
  end
  if over and not shadow then
    reply[2] = 0
    break
  end
end

if reply[2] == 1 then
  for i = 1, #KEYS do
    if dirty[i] then
      local until_ms = tats[i] - now
      if ticks[i] > 0 then
        until_ms = until_ms + 1
      end
      redis.call('SET', KEYS[i], string.format('%d,%d,%d', tats[i], ticks[i], counts[i]), 'PX', math.max(until_ms, 1) + slack)
    end
  end
end
return reply
