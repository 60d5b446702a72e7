-- A calendar window (src/engine/calendar.rs): a fixed window whose four
-- boundaries (three windows) the sidecar computed from the calendar; Redis
-- TIME picks the window, so sidecars whose clocks differ roll over at the
-- same instant. Its state is a fixed window's (w, window.lua), its key
-- expiring at the window's end.
--   item:  d slot limit b0 b1 b2 b3 hits shadow
--   refund of d: a b c = b0 b1 b2
LOAD.d = WANT.d and function()
  need('w')

  -- The start of the window of now, and its end (as CalendarItem::window_at).
  local function window_at(b0, b1, b2, b3)
    if now < b1 then
      return b0, b1
    elseif now < b2 then
      return b1, b2
    end
    return b2, b3
  end

  ITEM.d = function(at)
    local slot, limit = tonumber(ARGV[at + 1]), num(ARGV[at + 2])
    local start, finish = window_at(num(ARGV[at + 3]), num(ARGV[at + 4]), num(ARGV[at + 5]), num(ARGV[at + 6]))
    local hits, shadow = num(ARGV[at + 7]), ARGV[at + 8] == '1'
    local state = slots[slot]
    local count = 0
    if state.start == start then
      count = state.count
    end
    local over = count + math.max(hits, 1) > limit
    if hits > 0 and not over then
      if state.start ~= start then
        slots[slot] = { start = start, count = 0, exp = finish, period = finish - start }
        fresh_window[slot] = true
      end
      slots[slot].count = count + hits
      dirty[slot] = true
    end
    return over, shadow, at + 9
  end

  LATER.d = function(at)
    return false, at + 9
  end

  REFUND.d = function(slot, hits, b0, b1, b2)
    local start = window_at(b0, b1, b2, INF)
    local state = slots[slot]
    if state.start == start then
      state.count = math.max(state.count - hits, 0)
      dirty[slot] = true
    end
  end
end
