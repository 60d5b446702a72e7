-- Charon: one atomic decision on Redis, for a batch of fixed windows only.
--
-- The common case (every envoyproxy/ratelimit limit is a fixed window) gets
-- a script of its own: the same wire, state encoding and verdict as the
-- w chunk of the batch script (kinds/window.lua, which documents them), without the tier,
-- log and bucket machinery Redis would otherwise set up on every call.
--
-- Three call shapes (docs/performance.md#redis-work-per-decision says what
-- each part of a call costs Redis):
--
-- * One item on one key, the usual request: ARGV limit period hits flags,
--   and a fifth, the injected time in ms, in tests only. Returns one string,
--   "granted seconds.micros value" (Redis TIME as it read it; with an
--   injected time, "granted ms value"), the value empty when the key held
--   none: Redis turns a table into a reply at several times the cost of a
--   string, and every argument costs as much as a line of Lua.
-- * Any batch: KEYS the window keys. ARGV[1]: "0" for Redis TIME, or an
--   injected time in ms (tests only). ARGV[2]: kind letters (all "w").
--   ARGV[3]: number of items, then per item: w slot limit period hits flags.
--   Returns {now, granted, value before...}.
-- * Single decisions queued on one key, each with its own verdict: the
--   sidecar's queue for a hot key (below).
--
-- A limit of "-1" is no limit; flags: 1 shadow, 2 count rejected hits
-- (recorded even when the item or the batch is rejected, as
-- envoyproxy/ratelimit counts). State: "start,count,expires_at".
--
-- Numbers are read with "+ 0" (tonumber parses a string twice) and written
-- with %d (every one here is a whole number below 2^53, which Lua's %d, a C
-- long, writes exactly, at a fraction of what %.0f costs): each saved a
-- tenth of the one-item call. On the one-item path, globals are read once
-- into locals (each read of `ARGV`, `redis` or `string` is a table lookup)
-- and `%` stands for math.fmod and math.floor: both exact on whole numbers
-- below 2^53, without a C call (docs/redis.md#what-a-decision-costs-redis).

local argv, call = ARGV, redis.call
local one = #argv < 6
local now, slack, spread, time
local injected = argv[one and 5 or 1]
if injected and injected ~= '0' then
  -- Virtual time: keys outlive their virtual relevance by a day.
  now, slack, spread = tonumber(injected), 86400000, 0
else
  time = call('TIME')
  local micros = time[2] + 0
  local sub_ms = micros % 1000
  now, slack = time[1] * 1000 + (micros - sub_ms) / 1000, 0
  -- Every tenant's window ends at the same instant: keys that all expired
  -- then would stall Redis while it deletes them (tens of ms for 10^5
  -- keys). A window's key lives on for a fraction of min(period, 1 min)
  -- taken from the clock's microseconds, which spreads their expiry; the
  -- state itself says when its window ends, so a late key changes nothing.
  spread = sub_ms / 1000
end

-- One item on one key: the decision of the batch below, without its tables.
-- (The expiry is window_ttl's, below, written out: a function made on every
-- call costs more than the line.)
if one then
  -- Flags and hits are compared as the strings they arrive as (interned,
  -- so a comparison is one pointer's), and the state is cut with one
  -- match that also gives where its count stands: parsing numbers is most
  -- of what this path costs Redis beyond its three calls.
  local limit, period, hits, flags = argv[1] + 0, argv[2] + 0, argv[3], argv[4]
  -- What the request needs free: its hits, at least one.
  local least = 1
  if hits == '1' then
    hits = 1
  else
    hits = hits + 0
    if hits > 1 then
      least = hits
    end
  end
  local key = KEYS[1]
  local value = call('GET', key)
  local start = now
  if period > 1 then
    start = now - now % period
  end
  local count, same, first, c, second = 0, false, nil, nil, nil
  local text = string
  if value then
    local s
    s, first, c, second = text.match(value, '^(%d+)(),(%d+)(),')
    if second == nil then
      error('charon: not a window state: ' .. value)
    end
    same = s + 0 == start
    if same then
      count = c + 0
    end
  end
  local over = limit ~= -1 and count + least > limit
  if hits > 0 and (flags == '2' or flags == '3' or not over) then
    if same then
      -- The window's start and end stay as they are written. A count as
      -- wide as the one it replaces is written in place, after a start of
      -- 13 digits (every instant in ms from 2001 to 2286) and its comma:
      -- the same bytes as a whole SET, without making them in Lua.
      local written = text.format('%d', count + hits)
      if first == 14 and #written == #c then
        call('SETRANGE', key, '14', written)
      else
        local sub = text.sub
        call('SET', key, sub(value, 1, first) .. written .. sub(value, second), 'KEEPTTL')
      end
    else
      local state = text.format('%d,%d,%d', start, count + hits, start + period)
      -- Whole before it is added: a fraction added to the TTL first would
      -- be rounded with it, and Redis refuses a PX that is not whole.
      local late = spread * 60000
      if period < 60000 then
        late = spread * period
      end
      late = late - late % 1
      call('SET', key, state, 'PX', start + period - now + slack + late)
    end
  end
  local granted = '1 '
  if over and (flags == '0' or flags == '2') then
    granted = '0 '
  end
  if time then
    return granted .. time[1] .. '.' .. time[2] .. ' ' .. (value or '')
  end
  return granted .. injected .. ' ' .. (value or '')
end

-- Decisions queued on one key behind a call in flight (a hot key): each
-- decided in turn at one instant, exactly as the one-item path would decide
-- them one after another, with one GET and at most one SET for them all.
-- ARGV[1]: "0" for Redis TIME, or an injected time in ms (tests only).
-- ARGV[2]: "q". Then per decision: limit period hits flags. Returns one
-- string, "verdicts clock value": a 1 or 0 per decision, in order.
if ARGV[2] == 'q' then
  local value = redis.call('GET', KEYS[1])
  local start, count, ends, fresh, dirty = 0, 0, 0, false, false
  if value then
    local s, c, e = string.match(value, '^(%d+),(%d+),(%d+)$')
    if e == nil then
      error('charon: not a window state: ' .. value)
    end
    start, count, ends = s + 0, c + 0, e + 0
  end
  local verdicts = {}
  local last_period = 0
  for at = 3, #ARGV, 4 do
    local limit, period, hits, flags = ARGV[at] + 0, ARGV[at + 1] + 0, ARGV[at + 2] + 0, ARGV[at + 3]
    local item_start = now - math.fmod(now, math.max(period, 1))
    local current = 0
    if start == item_start then
      current = count
    end
    local over = limit ~= -1 and current + math.max(hits, 1) > limit
    if hits > 0 and (flags == '2' or flags == '3' or not over) then
      if start ~= item_start then
        start, count, fresh = item_start, 0, true
      end
      count, ends, last_period, dirty = count + hits, item_start + period, period, true
    end
    if over and (flags == '0' or flags == '2') then
      verdicts[#verdicts + 1] = '0'
    else
      verdicts[#verdicts + 1] = '1'
    end
  end
  if dirty then
    local state = string.format('%d,%d,%d', start, count, ends)
    if fresh then
      redis.call('SET', KEYS[1], state, 'PX', ends - now + slack + math.floor(spread * math.min(last_period, 60000)))
    else
      redis.call('SET', KEYS[1], state, 'KEEPTTL')
    end
  end
  local clock = injected
  if time then
    clock = time[1] .. '.' .. time[2]
  end
  return table.concat(verdicts) .. ' ' .. clock .. ' ' .. (value or '')
end

-- The TTL of a window key written now.
local function window_ttl(ends, period)
  return ends - now + slack + math.floor(spread * math.min(period, 60000))
end

local reply = { now, 1 }
local starts, counts, expires, periods, fresh, dirty = {}, {}, {}, {}, {}, {}
-- The hits that count even if the batch is rejected, per slot, and the
-- window they are in.
local kept, kept_start = {}, {}
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  reply[i + 2] = value
  local start, count, expires = 0, 0, 0
  if value then
    local s, c, e = string.match(value, '^(%d+),(%d+),(%d+)$')
    if e == nil then
      error('charon: not a window state: ' .. value)
    end
    if tonumber(e) > now then
      start, count = tonumber(s), tonumber(c)
    end
  end
  starts[i], counts[i] = start, count
end

local original_starts, original_counts = {}, {}
for i = 1, #KEYS do
  original_starts[i], original_counts[i] = starts[i], counts[i]
end

local at = 4
for _ = 1, tonumber(ARGV[3]) do
  local slot, limit, period, hits = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local flags = tonumber(ARGV[at + 5])
  local shadow, counting = flags % 2 == 1, flags >= 2
  at = at + 6
  -- Once rejected, only the hits that count anyway matter.
  if reply[2] == 1 or counting then
    if limit == -1 then
      limit = math.huge
    end
    local start = now - math.fmod(now, math.max(period, 1))
    local count = 0
    if starts[slot] == start then
      count = counts[slot]
    end
    local over = count + math.max(hits, 1) > limit
    if over and not shadow then
      reply[2] = 0
    end
    if hits > 0 and (counting or not over) then
      if starts[slot] ~= start then
        starts[slot], counts[slot], fresh[slot] = start, 0, true
      end
      counts[slot] = counts[slot] + hits
      expires[slot], periods[slot] = start + period, period
      dirty[slot] = true
      if counting then
        kept[slot], kept_start[slot] = (kept[slot] or 0) + hits, start
      end
    end
  end
end

if reply[2] == 0 then
  -- Rejected: the original state plus the hits that count anyway.
  for i = 1, #KEYS do
    dirty[i] = false
    if kept[i] then
      local start = kept_start[i]
      if original_starts[i] == start then
        counts[i], fresh[i] = original_counts[i] + kept[i], false
      else
        counts[i], fresh[i] = kept[i], true
      end
      starts[i], dirty[i] = start, true
    end
  end
end

do
  for i = 1, #KEYS do
    if dirty[i] then
      local value = string.format('%d,%d,%d', starts[i], counts[i], expires[i])
      if fresh[i] then
        redis.call('SET', KEYS[i], value, 'PX', window_ttl(expires[i], periods[i]))
      else
        -- Same window: the key's expiry is already right.
        redis.call('SET', KEYS[i], value, 'KEEPTTL')
      end
    end
  end
end
return reply
