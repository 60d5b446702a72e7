-- A sliding window counter (src/engine/sliding.rs): the previous window
-- weighted in 1/65536, every product under 2^53.
--   item:  s slot limit period hits shadow
--   refund of s: a b = limit period
--   state: s "start,current,previous,expires_at" (the current window's
--          count and the one before)
LOAD.s = WANT.s and function()
  DECODE.s = function(raw, now)
    if raw then
      local f = split(raw, ',')
      local state = { start = num(f[1]), current = num(f[2]), previous = num(f[3]), exp = num(f[4]) }
      if state.exp > now then
        return state
      end
    end
    return { start = 0, current = 0, previous = 0, exp = 0 }
  end

  ENCODE.s = function(i, state)
    local value = fmt(state.start) .. ',' .. fmt(state.current) .. ',' .. fmt(state.previous) .. ',' .. fmt(state.exp)
    redis.call('SET', KEYS[i], value, 'PX', state.exp - now + slack)
  end

  ITEM.s = function(at)
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local shadow = ARGV[at + 5] == '1'
    local state = slots[slot]
    local span = math.max(period, 1)
    local start = now - math.fmod(now, span)
    local current, previous = 0, 0
    if state.start == start then
      current, previous = state.current, state.previous
    elseif state.start + period == start then
      previous = state.current
    end
    local weight = math.floor(math.max(span - (now - start), 0) * 65536 / span)
    local estimate = current + math.floor(previous * weight / 65536)
    local over = estimate + math.max(hits, 1) > limit
    if not over and hits > 0 then
      slots[slot] = { start = start, current = current + hits, previous = previous, exp = start + 2 * period }
      dirty[slot] = true
    end
    return over, shadow, at + 6
  end

  LATER.s = function(at)
    return false, at + 6
  end

  REFUND.s = function(slot, hits, _, period)
    local state = slots[slot]
    if state.start == now - math.fmod(now, math.max(period, 1)) then
      state.current = math.max(state.current - hits, 0)
      dirty[slot] = true
    end
  end
end
