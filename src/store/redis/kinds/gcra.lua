-- GCRA, a token bucket (src/engine/gcra.rs): time counted in ticks of
-- 1/count ms, so that the emission interval period/count is exactly
-- `period` ticks; computed relative to now, which keeps the numbers exact
-- in doubles. gcra.lua decides a batch of buckets alone the same way.
--   item:  a slot count period burst hits shadow
--   refund of a: a b c = count period burst
--   state: a "tat_ms,ticks,count": the theoretical arrival time, tat_ms
--          plus ticks/count ms
LOAD.a = WANT.a and function()
  DECODE.a = function(raw)
    if not raw then
      return { ms = 0, ticks = 0, count = -1 }
    end
    local f = split(raw, ',')
    return { ms = num(f[1]), ticks = num(f[2]), count = num(f[3]) }
  end

  ENCODE.a = function(i, state)
    local value = fmt(state.ms) .. ',' .. fmt(state.ticks) .. ',' .. fmt(state.count)
    local until_ms = state.ms - now
    if state.ticks > 0 then
      until_ms = until_ms + 1
    end
    redis.call('SET', KEYS[i], value, 'PX', math.max(until_ms, 1) + slack)
  end

  ITEM.a = function(at)
    local slot, count, period = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3])
    local burst, hits = num(ARGV[at + 4]), num(ARGV[at + 5])
    local shadow = ARGV[at + 6] == '1'
    local over
    if count == 0 or period == 0 then
      over = true
    else
      local state = slots[slot]
      -- Ticks from now to the TAT (0 if it has passed or is of another rate).
      local ahead = 0
      if state.count == count then
        ahead = math.max(0, (state.ms - now) * count + state.ticks)
      end
      local next = ahead + math.max(hits, 1) * period
      over = next > burst * period
      if not over and hits > 0 then
        local ticks = math.fmod(next, count)
        slots[slot] = { ms = now + (next - ticks) / count, ticks = ticks, count = count }
        dirty[slot] = true
      end
    end
    return over, shadow, at + 7
  end

  LATER.a = function(at)
    return false, at + 7
  end

  REFUND.a = function(slot, hits, count, period)
    local state = slots[slot]
    if count ~= 0 and period ~= 0 and state.count == count then
      local ahead = (state.ms - now) * count + state.ticks
      if ahead > 0 then
        ahead = math.max(ahead - hits * period, 0)
        local ticks = math.fmod(ahead, count)
        slots[slot] = { ms = now + (ahead - ticks) / count, ticks = ticks, count = count }
        dirty[slot] = true
      end
    end
  end
end
