-- A sliding window log (src/engine/sliding_log.rs): every hit of the
-- trailing window, the newest `limit` kept; its state and helpers are the
-- time logs of decide/logs.lua.
--   item:  l slot limit period hits flags (as w's: 1 shadow, 2 count
--          rejected hits)
--   refund of l: a b = limit period
--   state: l "expires_at|log"
LOAD.l = WANT.l and function()
  DECODE.l = slog_decode
  ENCODE.l = slog_encode

  ITEM.l = function(at)
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local flags = tonumber(ARGV[at + 5])
    local counting = flags >= 2
    local shadow = flags % 2 == 1
    local state = slots[slot]
    local over = log_count(state.log, now, period) + math.max(hits, 1) > limit
    if hits > 0 and (counting or not over) then
      slog_record(state, limit, period, hits, now)
      dirty[slot] = true
      if counting then
        local logged = refused[slot] or { kind = 'l' }
        table.insert(logged, { hits, period, limit })
        refused[slot] = logged
      end
    end
    return over, shadow, at + 6
  end

  LATER.l = function(at)
    return tonumber(ARGV[at + 5]) >= 2, at + 6
  end

  REPLAY.l = function(raw, logged)
    local state = slog_decode(raw, now)
    for _, hit in ipairs(logged) do
      slog_record(state, hit[3], hit[2], hit[1], now)
    end
    return state
  end

  REFUND.l = function(slot, hits, _, period)
    local state = slots[slot]
    log_prune(state.log, now, period)
    if state.log.total > 0 then
      log_trim(state.log, math.max(state.log.total - hits, 0))
      state.exp = log_counts_until(state.log, period)
      dirty[slot] = true
    end
  end
end
