-- A resource's ban as Cloud Armor defines it (src/engine/ban.rs, which
-- says why): the hit that trips it is refused and recorded.
--   item:  b slot limit window duration hits shadow
--   state: b "start,count,banned_until,expires_at"
LOAD.b = WANT.b and function()
  local function decode(raw, now)
    if raw then
      local f = split(raw, ',')
      local state = { start = num(f[1]), count = num(f[2]), banned = num(f[3]), exp = num(f[4]) }
      if state.exp > now then
        return state
      end
    end
    return { start = 0, count = 0, banned = 0, exp = 0 }
  end

  -- Whether `hits` are over, and the state to record (nil: none).
  local function decide(state, limit, window, duration, hits, now)
    if state.banned > now then
      return true, nil
    end
    local seen = { start = state.start, count = state.count, banned = state.banned, exp = state.exp }
    if seen.exp <= now or seen.start + window <= now then
      seen = { start = now, count = 0, banned = 0, exp = 0 }
    end
    local over = seen.count + math.max(hits, 1) > limit
    if over then
      seen.banned = seen.start + window + duration
    else
      seen.count = seen.count + hits
    end
    seen.exp = math.max(seen.start + window, seen.banned)
    if hits == 0 then
      return over, nil
    end
    return over, seen
  end

  DECODE.b = decode

  ENCODE.b = function(i, state)
    local value = fmt(state.start) .. ',' .. fmt(state.count) .. ',' .. fmt(state.banned) .. ',' .. fmt(state.exp)
    redis.call('SET', KEYS[i], value, 'PX', math.max(state.exp - now, 1) + slack)
  end

  ITEM.b = function(at)
    local slot, limit, window, duration = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local hits = num(ARGV[at + 5])
    local shadow = ARGV[at + 6] == '1'
    local over, record = decide(slots[slot], limit, window, duration, hits, now)
    if record ~= nil then
      slots[slot] = record
      dirty[slot] = true
      if over then
        -- A trip is recorded whatever the verdict: replayed on the stored
        -- state if the batch is refused.
        local tripped = refused[slot] or { kind = 'b' }
        table.insert(tripped, { limit, window, duration, hits })
        refused[slot] = tripped
      end
    end
    return over, shadow, at + 7
  end

  LATER.b = function(at)
    return tonumber(ARGV[at + 5]) > 0, at + 7
  end

  REPLAY.b = function(raw, tripped)
    local state = decode(raw, now)
    for _, trip in ipairs(tripped) do
      local over, record = decide(state, trip[1], trip[2], trip[3], trip[4], now)
      if over and record ~= nil then
        state = record
      end
    end
    return state
  end
end
