-- The hybrid quota-linear limiter (src/engine/hybrid.rs, which says why):
-- bursty until a client spends its quota, then an even rate.
--   item:  h slot quota window hits shadow
--   state: h "mode,time,bucket,expires_at": mode b (bursty) or s (smooth),
--          the bucket in tokens x window
LOAD.h = WANT.h and function()
  local function decode(raw, now)
    if raw then
      local f = split(raw, ',')
      local state = { mode = f[1], time = num(f[2]), bucket = num(f[3]), exp = num(f[4]) }
      if state.exp > now then
        return state
      end
    end
    return { mode = 'f', time = 0, bucket = 0, exp = 0 }
  end

  local function refill(bucket, quota, window)
    local missing = quota * window - bucket
    if missing <= 0 then
      return 0
    end
    return math.ceil(missing / math.max(quota, 1))
  end

  -- Whether `hits` (at least one) are over, and the state they leave.
  local function decide(state, quota, window, hits, now)
    local asked = math.max(hits, 1)
    local seen = { mode = state.mode, time = state.time, bucket = state.bucket }
    if seen.mode == 's' then
      seen.bucket = seen.bucket + math.max(now - seen.time, 0) * quota
      seen.time = math.max(now, seen.time)
    end
    local full = quota * window
    local fresh = seen.mode == 'f' or (seen.mode == 'b' and seen.time + window <= now) or
      (seen.mode == 's' and seen.bucket >= full)
    if fresh then
      seen = { mode = 'b', time = now, bucket = full }
    end
    local w = math.max(window, 1)
    local tokens = math.floor(math.max(seen.bucket, 0) / w)
    if asked > tokens or quota == 0 then
      return true, nil
    end
    local after = { mode = seen.mode, time = seen.time, bucket = seen.bucket - asked * w }
    if after.mode == 'b' and after.bucket == 0 and not (fresh and asked == 1) then
      -- The last token of a bursty window: smooth mode, owing the rest of it.
      local remaining = math.max(seen.time + window - now, 0)
      after.bucket = w - remaining * quota
      after.time = now
      after.mode = 's'
    end
    if after.mode == 'b' then
      after.exp = after.time + window
    else
      after.exp = after.time + refill(after.bucket, quota, window)
    end
    return false, after
  end

  DECODE.h = decode

  ENCODE.h = function(i, state)
    local value = state.mode .. ',' .. fmt(state.time) .. ',' .. fmt(state.bucket) .. ',' .. fmt(state.exp)
    redis.call('SET', KEYS[i], value, 'PX', math.max(state.exp - now, 1) + slack)
  end

  ITEM.h = function(at)
    local slot, quota, window, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local shadow = ARGV[at + 5] == '1'
    local over, after = decide(slots[slot], quota, window, hits, now)
    if not over and hits > 0 then
      slots[slot] = after
      dirty[slot] = true
    end
    return over, shadow, at + 6
  end

  LATER.h = function(at)
    return false, at + 6
  end
end
