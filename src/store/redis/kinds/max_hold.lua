-- A concurrency limit (src/engine/max_hold.rs, which says why): hits
-- held in a time log (decide/logs.lua) whose window is max_hold; a hit not
-- held, refused or in a refused batch, is owed its refund in owed_slot, a
-- w state "last owed,count,expires_at", forgotten max_hold after the last.
--   item:  k slot owed_slot limit max_hold hits shadow
--   refund of k: a b c = owed_slot limit max_hold
LOAD.k = WANT.k and function()
  -- What is owed is a w state.
  need('w')
  local function owe(state, hold, hits, now)
    local owed = 0
    if state.exp > now then
      owed = state.count
    end
    return { start = now, count = owed + hits, exp = now + hold, period = hold }
  end

  -- A held log is kept max_hold after its last hit leaves, so that hits held
  -- past their time are still there for the next decision to count.
  local function held_keep(state, hold)
    state.exp = log_counts_until(state.log, hold)
    if state.exp > 0 then
      state.exp = state.exp + hold
    end
  end

  local function held_prune(state, hold, now)
    log_prune(state.log, now, hold)
    held_keep(state, hold)
  end

  ITEM.k = function(at)
    local slot, owed, limit = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), num(ARGV[at + 3])
    local hold, hits = num(ARGV[at + 4]), num(ARGV[at + 5])
    local shadow = ARGV[at + 6] == '1'
    local state = slots[slot]
    held_prune(state, hold, now)
    dirty[slot] = true
    local over = state.log.total + math.max(hits, 1) > limit
    if hits > 0 then
      if over then
        slots[owed] = owe(slots[owed], hold, hits, now)
        dirty[owed], fresh_window[owed] = true, true
      else
        slog_record(state, limit, hold, hits, now)
        held_keep(state, hold)
      end
      -- A refused batch holds nothing: every hit asked is owed.
      local owing = refused[owed] or { kind = 'k' }
      table.insert(owing, { hold, hits })
      refused[owed] = owing
    end
    return over, shadow, at + 7
  end

  LATER.k = function(at)
    return num(ARGV[at + 5]) > 0, at + 7
  end

  REPLAY.k = function(raw, owing, i)
    local state = DECODE.w(raw, now)
    for _, o in ipairs(owing) do
      state = owe(state, o[1], o[2], now)
    end
    fresh_window[i] = true
    return state
  end

  REFUND.k = function(slot, hits, owed_slot, _, hold)
    local state, owed = slots[slot], slots[owed_slot]
    held_prune(state, hold, now)
    dirty[slot] = true
    local paid = 0
    if owed.exp > now then
      paid = math.min(owed.count, hits)
    end
    if paid > 0 then
      owed.count = owed.count - paid
      dirty[owed_slot] = true
    end
    log_trim(state.log, math.max(state.log.total - (hits - paid), 0))
    held_keep(state, hold)
  end
end
