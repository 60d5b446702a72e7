-- A fixed window (src/engine/window.rs), envoyproxy/ratelimit's.
--   item:  w slot limit period hits flags (1 shadow, 2 count rejected hits:
--          they are recorded even when the item or the batch is rejected)
--   refund of w: a b = limit period
--   state: w "start,count,expires_at"
LOAD.w = WANT.w and function()
  local function decode(raw, now)
    if raw then
      local f = split(raw, ',')
      local state = { start = num(f[1]), count = num(f[2]), exp = num(f[3]) }
      if state.exp > now then
        return state
      end
    end
    return { start = 0, count = 0, exp = 0 }
  end
  DECODE.w = decode

  ENCODE.w = function(i, state)
    local value = fmt(state.start) .. ',' .. fmt(state.count) .. ',' .. fmt(state.exp)
    if fresh_window[i] then
      local late = math.floor(spread * math.min(state.period, 60000))
      redis.call('SET', KEYS[i], value, 'PX', state.exp - now + slack + late)
    else
      -- Same window: its expiry is already right.
      redis.call('SET', KEYS[i], value, 'KEEPTTL')
    end
  end

  ITEM.w = function(at)
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local flags = tonumber(ARGV[at + 5])
    local counting = flags >= 2
    local shadow = flags % 2 == 1
    local state = slots[slot]
    local start = now - math.fmod(now, math.max(period, 1))
    local count = 0
    if state.start == start then
      count = state.count
    end
    local over = count + math.max(hits, 1) > limit
    if hits > 0 and (counting or not over) then
      if state.start ~= start then
        slots[slot] = { start = start, count = 0, exp = start + period, period = period }
        state = slots[slot]
        fresh_window[slot] = true
      end
      state.count = state.count + hits
      state.exp = start + period
      dirty[slot] = true
      if counting then
        local kept = refused[slot] or { kind = 'w', hits = 0 }
        kept.hits, kept.start, kept.period = kept.hits + hits, start, period
        refused[slot] = kept
      end
    end
    return over, shadow, at + 6
  end

  LATER.w = function(at)
    return tonumber(ARGV[at + 5]) >= 2, at + 6
  end

  -- The hits kept, on the window as stored.
  REPLAY.w = function(raw, kept, i)
    local state = decode(raw, now)
    if state.start ~= kept.start then
      state = { start = kept.start, count = 0 }
      fresh_window[i] = true
    else
      fresh_window[i] = false
    end
    state.count = state.count + kept.hits
    state.exp = kept.start + kept.period
    state.period = kept.period
    return state
  end

  REFUND.w = function(slot, hits, _, period)
    local state = slots[slot]
    if state.start == now - math.fmod(now, math.max(period, 1)) then
      state.count = math.max(state.count - hits, 0)
      dirty[slot] = true
    end
  end
end
