-- Costs known after the response (src/engine/cost.rs, which says why):
-- integers only, so that both compute the same state to the unit.
--   item:  c slot limit period hits shadow initial_cost op id extra
--          on_expiry: op h: hits > 0 charges, always recorded; 0 checks
--          and, admitted, counts one request in flight; r reserves `hits`
--          as reservation `id` for `extra` ms (charged on expiry if
--          on_expiry is 1); m commits `id` at `hits`; x cancels `id`; f
--          refunds `hits` charged at `extra`, in its window only
--   refund of c: a b c = limit period initial_cost
--   state: c "start,used,mean,dev,duration,expires_at|t,t,...|id:amount:
--          expires_at:charge,..." (the admissions in flight, oldest first;
--          mean and dev in sixteenths; the reservations held)
LOAD.c = WANT.c and function()
  local COST_SCALE, MAX_PENDING, MAX_RESERVATIONS, LEARNED_TTL = 16, 1024, 1024, 3600000

  local function decode(raw, now)
    if raw then
      local parts = split(raw, '|')
      local f = split(parts[1], ',')
      local state = {
        start = num(f[1]), used = num(f[2]), mean = num(f[3]), dev = num(f[4]),
        duration = num(f[5]), exp = num(f[6]), pending = {}, reservations = {},
      }
      if parts[2] and parts[2] ~= '' then
        for _, t in ipairs(split(parts[2], ',')) do
          state.pending[#state.pending + 1] = num(t)
        end
      end
      if parts[3] and parts[3] ~= '' then
        for _, r in ipairs(split(parts[3], ',')) do
          local g = split(r, ':')
          state.reservations[#state.reservations + 1] = {
            id = g[1], amount = num(g[2]), exp = num(g[3]), charge = g[4] == '1',
          }
        end
      end
      if state.exp > now then
        return state
      end
    end
    return {
      start = 0, used = 0, mean = 0, dev = 0, duration = 0, exp = 0, pending = {}, reservations = {},
    }
  end

  local function encode(state)
    local pending, reservations = {}, {}
    for i, t in ipairs(state.pending) do
      pending[i] = fmt(t)
    end
    for i, r in ipairs(state.reservations) do
      local charge = '0'
      if r.charge then
        charge = '1'
      end
      reservations[i] = r.id .. ':' .. fmt(r.amount) .. ':' .. fmt(r.exp) .. ':' .. charge
    end
    return fmt(state.start) .. ',' .. fmt(state.used) .. ',' .. fmt(state.mean) .. ',' ..
      fmt(state.dev) .. ',' .. fmt(state.duration) .. ',' .. fmt(state.exp) .. '|' ..
      table.concat(pending, ',') .. '|' .. table.concat(reservations, ',')
  end

  local function cost_window(t, period)
    return t - math.fmod(t, math.max(period, 1))
  end

  -- What expired reservations charge to the window starting at `start`.
  local function cost_expired(state, period, start, now)
    local sum = 0
    for _, r in ipairs(state.reservations) do
      if r.exp <= now and r.charge and cost_window(r.exp, period) == start then
        sum = sum + r.amount
      end
    end
    return sum
  end

  local function cost_held(state, now)
    local n, sum = 0, 0
    for _, r in ipairs(state.reservations) do
      if r.exp > now then
        n, sum = n + 1, sum + r.amount
      end
    end
    return n, sum
  end

  local function cost_find(state, id)
    for i, r in ipairs(state.reservations) do
      if r.id == id then
        return i, r
      end
    end
    return nil, nil
  end

  local function cost_duration(state)
    if state.duration == 0 then
      return 10000
    end
    return state.duration
  end

  local function cost_ttl(state)
    return math.min(math.max(cost_duration(state) * 2, 1000), 600000)
  end

  -- src/engine/cost.rs's SPREAD: the learned deviations a prediction adds.
  local COST_SPREAD = 10

  -- The deviation guessed from a first mean (cost.rs's first_dev).
  local function cost_first_dev(mean)
    return math.floor(mean * 3 / 20)
  end

  local function cost_reserved(n, mean, dev)
    if n == 0 then
      return 0
    end
    local spread = math.ceil(COST_SPREAD * dev * math.sqrt(n))
    return math.ceil((n * mean + spread) / COST_SCALE)
  end

  local function cost_estimate(state, initial)
    if state.mean == 0 and state.dev == 0 then
      local mean = initial * COST_SCALE
      return mean, cost_first_dev(mean)
    end
    return state.mean, state.dev
  end

  local function cost_live(state, now)
    local ttl, n = cost_ttl(state), 0
    for _, t in ipairs(state.pending) do
      if t + ttl > now then
        n = n + 1
      end
    end
    return n
  end

  local function cost_settle(state, period, now)
    local ttl, kept = cost_ttl(state), {}
    for _, t in ipairs(state.pending) do
      if t + ttl > now then
        kept[#kept + 1] = t
      end
    end
    state.pending = kept
    local start = cost_window(now, period)
    if state.start ~= start then
      state.start, state.used = start, 0
    end
    state.used = state.used + cost_expired(state, period, start, now)
    local live = {}
    for _, r in ipairs(state.reservations) do
      if r.exp > now then
        live[#live + 1] = r
      end
    end
    state.reservations = live
  end

  local function towards(value, sample)
    return math.max(value + math.floor((sample - value) / 64), 0)
  end

  local function cost_touch(state, period, now)
    local window_end = now - math.fmod(now, math.max(period, 1)) + period
    local last = 0
    if #state.pending > 0 then
      last = state.pending[#state.pending] + cost_ttl(state)
    end
    -- A reservation that expires charged must find its window.
    for _, r in ipairs(state.reservations) do
      last = math.max(last, r.exp + period)
    end
    state.exp = math.max(window_end, last, now + LEARNED_TTL)
  end

  local function cost_learn(state, hits)
    local sample = hits * COST_SCALE
    if state.mean == 0 and state.dev == 0 then
      state.mean, state.dev = sample, cost_first_dev(sample)
    else
      local deviation = math.abs(sample - state.mean)
      state.mean = towards(state.mean, sample)
      state.dev = towards(state.dev, deviation)
    end
  end

  local function cost_charge(state, period, hits, now)
    cost_settle(state, period, now)
    state.used = state.used + hits
    if #state.pending > 0 then
      local took = math.max(now - table.remove(state.pending, 1), 0)
      local known = cost_duration(state)
      if took > known then
        state.duration = math.max(took, 1)
      else
        state.duration = math.max(known - math.floor((known - took) / 64), 1)
      end
    end
    cost_learn(state, hits)
    cost_touch(state, period, now)
  end

  local function cost_admit(state, period, now)
    cost_settle(state, period, now)
    if #state.pending >= MAX_PENDING then
      table.remove(state.pending, 1)
    end
    state.pending[#state.pending + 1] = now
    cost_touch(state, period, now)
  end

  DECODE.c = decode

  ENCODE.c = function(i, state)
    redis.call('SET', KEYS[i], encode(state), 'PX', state.exp - now + slack)
  end

  ITEM.c = function(at)
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local shadow = ARGV[at + 5] == '1'
    local initial = num(ARGV[at + 6])
    local op, id, extra, charge_on_expiry = ARGV[at + 7], ARGV[at + 8], num(ARGV[at + 9]), ARGV[at + 10] == '1'
    local state = slots[slot]
    local over
    if op == 'h' and hits > 0 then
      over = false
      cost_charge(state, period, hits, now)
      local charges = refused[slot] or { kind = 'c' }
      table.insert(charges, { hits, period })
      refused[slot] = charges
      dirty[slot] = true
    else
      local start = cost_window(now, period)
      local used = 0
      if state.start == start then
        used = state.used
      end
      used = used + cost_expired(state, period, start, now)
      local mean, dev = cost_estimate(state, initial)
      local live = cost_live(state, now)
      local holding, held = cost_held(state, now)
      local found, reservation = nil, nil
      if op ~= 'h' then
        found, reservation = cost_find(state, id)
      end
      if op == 'h' then
        over = used + held + cost_reserved(live + 1, mean, dev) > limit and
          not (live == 0 and used == 0 and held == 0)
      elseif op == 'r' then
        over = used + held + cost_reserved(live, mean, dev) + hits > limit or
          holding >= MAX_RESERVATIONS or found ~= nil
      elseif op == 'm' or op == 'x' then
        over = found == nil or reservation.exp <= now
      else
        over = cost_window(extra, period) ~= start
      end
      if not over then
        if op == 'h' then
          cost_admit(state, period, now)
        else
          cost_settle(state, period, now)
          if op == 'r' then
            state.reservations[#state.reservations + 1] = {
              id = id, amount = hits, exp = now + math.max(extra, 1), charge = charge_on_expiry,
            }
          elseif op == 'm' or op == 'x' then
            table.remove(state.reservations, (cost_find(state, id)))
            if op == 'm' then
              state.used = state.used + hits
              if hits > 0 then
                cost_learn(state, hits)
              end
            end
          else
            state.used = math.max(state.used - hits, 0)
          end
          cost_touch(state, period, now)
        end
        dirty[slot] = true
      end
    end
    return over, shadow, at + 11
  end

  LATER.c = function(at)
    return ARGV[at + 7] == 'h' and tonumber(ARGV[at + 4]) > 0, at + 11
  end

  -- The charges, on the budget as stored.
  REPLAY.c = function(raw, charges)
    local state = decode(raw, now)
    for _, charge in ipairs(charges) do
      cost_charge(state, charge[2], charge[1], now)
    end
    return state
  end

  REFUND.c = function(slot, hits, _, period)
    if hits > 0 then
      local state = slots[slot]
      cost_settle(state, period, now)
      state.used = math.max(state.used - hits, 0)
      cost_touch(state, period, now)
      dirty[slot] = true
    end
  end
end
