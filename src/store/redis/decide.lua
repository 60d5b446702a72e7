-- Charon: one atomic decision on Redis.
--
-- The same decision as the Rust engine (src/engine), on the state of KEYS, at
-- Redis TIME: every sidecar sharing this Redis reads one clock. The script only
-- decides and records; the sidecar rebuilds the detailed answer (remaining,
-- reset, retry-after, tier context) by running the Rust engine on the state
-- this script returns, which is the state it decided on.
--
-- KEYS: the state keys of the batch.
-- ARGV[1]: "0" to read Redis TIME, or an injected time in ms (tests only).
-- ARGV[2]: one kind letter per key: w (fixed window), t (tiers), g (global
--   log), a (GCRA), c (a cost known after the response), s (a sliding
--   window counter), h (the hybrid quota-linear limiter), l (a sliding
--   window log), b (a Cloud Armor ban).
-- ARGV[3]: number of items, then the items:
--   w slot limit period hits flags (1 shadow, 2 count rejected hits: they
--     are recorded even when the item or the batch is rejected)
--   a slot count period burst hits shadow
--   s slot limit period hits shadow
--   h slot quota window hits shadow (the hybrid quota-linear limiter)
--   l slot limit period hits flags (a sliding window log; flags as w's)
--   b slot limit window duration hits shadow (a Cloud Armor ban)
--   c slot limit period hits shadow initial_cost op id extra on_expiry: op
--     h: hits > 0 charges, always recorded; 0 checks and, admitted, counts
--     one request in flight; r reserves `hits` as reservation `id` for
--     `extra` ms (charged on expiry if on_expiry is 1); m commits `id` at
--     `hits`; x cancels `id`; f refunds `hits` charged at `extra`, in its
--     window only
--   k slot owed_slot limit max_hold hits shadow (a concurrency limit: hits
--     held in a sliding log of window max_hold; a hit not held, refused or
--     in a refused batch, is owed its refund in owed_slot, a w key)
--   r slot of hits a b c (a refund, applied with its batch: of the kind
--     of: w, s or l with a b = limit period; a with a b c = count period
--     burst; c with a b c = limit period initial_cost; k with a b c =
--     owed_slot limit max_hold)
--   t slot global_slot global_limit copies min_copies check_only shadow
--     hard_limit ntiers (limit window active cooldown skippable)*ntiers
--     gcra_count gcra_period gcra_burst (a token bucket instead of tiers;
--     gcra_count 0 when there is none)
-- Slots are 1-based, global_slot 0 when absent; -1 means "none" for limits
-- and "forever" for durations.
--
-- Returns {now, granted (0/1), value of KEYS[1] before, value of KEYS[2] ...}.
--
-- State encodings (decimal, compact; also decoded by src/store/redis/codec.rs):
--   w: "start,count,expires_at"
--   a: "tat_ms,ticks,count": the GCRA theoretical arrival time, tat_ms plus
--      ticks/count ms (GCRA counts time in ticks of 1/count ms, so that the
--      emission interval period/count is exactly `period` ticks; this script
--      computes relative to now, which keeps the numbers exact in doubles)
--   g: hit log "total~t:n,t:n,..." (time in ms, hits granted at that ms, and
--      their total; see "Hit logs" below)
--   t: "expires_at|recent log|entered;log|entered;log..." (logs as for g) with one
--      "entered;log" per tier, entered empty when the tier is not entered,
--      and "f" for an expiry that never comes; a resource with a token
--      bucket instead of tiers has one "b" field instead: "btat_ms,ticks,count"
--      (as the GCRA encoding above)
--   s: "start,current,previous,expires_at" (the current window's count and
--      the one before)
--   c: "start,used,mean,dev,duration,expires_at|t,t,..." (the admissions in
--      flight, oldest first; mean and dev in sixteenths)

local INF = math.huge
local SECOND = 1000
local ACTIVE, COOLDOWN, INACTIVE = 1, 2, 3

local function num(s)
  local n = tonumber(s)
  if n == nil then
    error('charon: not a number: ' .. tostring(s))
  end
  if n == -1 then
    return INF
  end
  return n
end

local function fmt(n)
  if n == INF then
    return 'f'
  end
  return string.format('%.0f', n)
end

-- Hit logs, kept as their encoded text "total~t:n,t:n,..." (times in
-- order, hits granted at each): counting and dropping what expired read only
-- the head, pushing touches only the tail, so a decision costs what expired
-- since the last one, not everything the log holds (a busy log has one entry
-- per millisecond of its window). A log without "total~" (written by an
-- older script) is summed once when read.

local function log_new()
  return { body = '', total = 0, last_t = nil, last_at = nil }
end

local function log_decode(s)
  if not s or s == '' then
    return log_new()
  end
  local total, body = string.match(s, '^(%d+)~(.*)$')
  if total == nil then
    body, total = s, 0
    for n in string.gmatch(body, ':(%d+)') do
      total = total + tonumber(n)
    end
  else
    total = tonumber(total)
  end
  local log = { body = body, total = total }
  -- The last entry: where it starts and its time, for pushes and expiries
  -- (found from the end: a pattern anchored only at the end would be tried
  -- at every position of the body).
  if body ~= '' then
    local comma = string.find(string.reverse(body), ',', 1, true)
    local at = 1
    if comma ~= nil then
      at = #body - comma + 2
    end
    log.last_at, log.last_t = at, tonumber(string.match(body, '^(%d+):', at))
  end
  return log
end

local function log_encode(log)
  if log.body == '' then
    return ''
  end
  return fmt(log.total) .. '~' .. log.body
end

-- Hits of the head that no longer count in a window of span w at now (a hit
-- at t counts while now <= t + w), and where the first one that does starts.
local function log_expired(log, now, window)
  local body, expired, at = log.body, 0, 1
  while true do
    local t, n, next_at = string.match(body, '^(%d+):(%d+),?()', at)
    if t == nil or tonumber(t) + window >= now then
      return expired, at
    end
    expired, at = expired + tonumber(n), next_at
  end
end

local function log_count(log, now, window)
  local expired = log_expired(log, now, window)
  return log.total - expired
end

local function log_prune(log, now, window)
  local expired, at = log_expired(log, now, window)
  if at == 1 then
    return
  end
  log.body = string.sub(log.body, at)
  log.total = log.total - expired
  if log.body == '' then
    log.last_t, log.last_at = nil, nil
  else
    log.last_at = log.last_at - at + 1
  end
end

local function log_push(log, now, n)
  if n == 0 then
    return
  end
  if log.last_t ~= nil and log.last_t >= now then
    local hits = tonumber(string.match(log.body, '^%d+:(%d+)', log.last_at))
    log.body = string.sub(log.body, 1, log.last_at - 1) .. fmt(log.last_t) .. ':' .. fmt(hits + n)
  else
    local sep = ','
    if log.body == '' then
      sep = ''
    end
    log.last_at = #log.body + #sep + 1
    log.last_t = now
    log.body = log.body .. sep .. fmt(now) .. ':' .. fmt(n)
  end
  log.total = log.total + n
end

local function log_clear(log)
  log.body, log.total, log.last_t, log.last_at = '', 0, nil, nil
end

-- Keeps the `limit` most recent hits (the oldest go first, part of an
-- instant's if need be).
local function log_trim(log, limit)
  while log.total > limit do
    local t, n, next_at = string.match(log.body, '^(%d+):(%d+),?()')
    n = tonumber(n)
    local excess = log.total - limit
    if n <= excess then
      if next_at > #log.body then
        log_clear(log)
        return
      end
      log.body = string.sub(log.body, next_at)
      log.last_at = log.last_at - next_at + 1
      log.total = log.total - n
    else
      local head = t .. ':' .. fmt(n - excess)
      local rest = string.sub(log.body, next_at)
      if rest == '' then
        log.body, log.last_at = head, 1
      else
        log.body = head .. ',' .. rest
        log.last_at = log.last_at - (next_at - 1) + #head + 1
      end
      log.total = limit
    end
  end
end

local function log_counts_until(log, window)
  if log.last_t == nil then
    return 0
  end
  return log.last_t + window + 1
end

-- Splits on a one-character separator, keeping empty fields.
local function split(s, sep)
  local fields, start = {}, 1
  while true do
    local at = string.find(s, sep, start, true)
    if at == nil then
      fields[#fields + 1] = string.sub(s, start)
      return fields
    end
    fields[#fields + 1] = string.sub(s, start, at - 1)
    start = at + 1
  end
end

local function expiry_decode(s)
  if s == 'f' then
    return INF
  end
  return num(s)
end

-- Decoding, treating state past its expiry as absent (as the memory store does).

local function window_decode(raw, now)
  if raw then
    local f = split(raw, ',')
    local state = { start = num(f[1]), count = num(f[2]), exp = num(f[3]) }
    if state.exp > now then
      return state
    end
  end
  return { start = 0, count = 0, exp = 0 }
end

-- Bans as Cloud Armor defines them (src/engine/ban.rs, which says why):
-- "start,count,banned_until,expires_at".
local function ban_decode(raw, now)
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
local function ban_decide(state, limit, window, duration, hits, now)
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

-- Sliding window logs (src/engine/sliding_log.rs): "expires_at|log".
local function slog_decode(raw, now)
  if raw then
    local bar = string.find(raw, '|', 1, true)
    if bar then
      local exp = num(string.sub(raw, 1, bar - 1))
      if exp > now then
        return { exp = exp, log = log_decode(string.sub(raw, bar + 1)) }
      end
    end
  end
  return { exp = 0, log = log_new() }
end

local function slog_record(state, limit, period, hits, now)
  log_prune(state.log, now, period)
  log_push(state.log, now, hits)
  log_trim(state.log, limit)
  state.exp = log_counts_until(state.log, period)
end

-- Concurrency limits (src/engine/concurrency.rs, which says why): the held
-- hits are a sliding log whose window is max_hold; the owed refunds a w
-- state "last owed,count,expires_at", forgotten max_hold after the last.
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

-- The hybrid quota-linear limiter (src/engine/hybrid.rs, which says why):
-- mode b (bursty) or s (smooth), time, bucket in tokens x window.
local function hybrid_decode(raw, now)
  if raw then
    local f = split(raw, ',')
    local state = { mode = f[1], time = num(f[2]), bucket = num(f[3]), exp = num(f[4]) }
    if state.exp > now then
      return state
    end
  end
  return { mode = 'f', time = 0, bucket = 0, exp = 0 }
end

local function hybrid_refill(bucket, quota, window)
  local missing = quota * window - bucket
  if missing <= 0 then
    return 0
  end
  return math.ceil(missing / math.max(quota, 1))
end

-- Whether `hits` (at least one) are over, and the state they leave.
local function hybrid_decide(state, quota, window, hits, now)
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
    after.exp = after.time + hybrid_refill(after.bucket, quota, window)
  end
  return false, after
end

-- Costs known after the response (src/engine/cost.rs, which says why):
-- integers only, so that both compute the same state to the unit.
local COST_SCALE, MAX_PENDING, MAX_RESERVATIONS, LEARNED_TTL = 16, 1024, 1024, 3600000

local function cost_decode(raw, now)
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

local function cost_encode(state)
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

-- Sliding window counters (src/engine/sliding.rs): the previous window
-- weighted in 1/65536, every product under 2^53.
local function sliding_decode(raw, now)
  if raw then
    local f = split(raw, ',')
    local state = { start = num(f[1]), current = num(f[2]), previous = num(f[3]), exp = num(f[4]) }
    if state.exp > now then
      return state
    end
  end
  return { start = 0, current = 0, previous = 0, exp = 0 }
end

local function gcra_decode(raw)
  if not raw then
    return { ms = 0, ticks = 0, count = -1 }
  end
  local f = split(raw, ',')
  return { ms = num(f[1]), ticks = num(f[2]), count = num(f[3]) }
end

local function tiers_decode(raw, now)
  if raw then
    local f = split(raw, '|')
    local state = { exp = expiry_decode(f[1]), recent = log_decode(f[2]), tiers = {} }
    if state.exp > now then
      for i = 3, #f do
        if string.sub(f[i], 1, 1) == 'b' then
          state.bucket = gcra_decode(string.sub(f[i], 2))
        else
          local entered, hits = string.match(f[i], '^(%d*);(.*)$')
          local tier = { hits = log_decode(hits) }
          if entered ~= nil and entered ~= '' then
            tier.entered = tonumber(entered)
          end
          state.tiers[#state.tiers + 1] = tier
        end
      end
      return state
    end
  end
  return { exp = 0, recent = log_new(), tiers = {} }
end

local function tiers_encode(state)
  local parts = { fmt(state.exp), log_encode(state.recent) }
  for i = 1, #state.tiers do
    local tier = state.tiers[i]
    local entered = ''
    if tier.entered ~= nil then
      entered = fmt(tier.entered)
    end
    parts[#parts + 1] = entered .. ';' .. log_encode(tier.hits)
  end
  local b = state.bucket
  if b ~= nil then
    parts[#parts + 1] = 'b' .. fmt(b.ms) .. ',' .. fmt(b.ticks) .. ',' .. fmt(b.count)
  end
  return table.concat(parts, '|')
end

local function global_decode(raw, now)
  local log = log_decode(raw)
  if log_counts_until(log, SECOND) > now then
    return log
  end
  return log_new()
end

-- Burst tiers (src/engine/tiers.rs).

local function phase(tier, entered, now)
  if entered == nil then
    return INACTIVE
  end
  local active_end = entered + tier.active
  if now < active_end then
    return ACTIVE
  elseif now < active_end + tier.cooldown then
    return COOLDOWN
  end
  return INACTIVE
end

local function tier_entered(state, i)
  local log = state.tiers[i]
  return log and log.entered
end

local function tier_count(policy, state, i, now)
  local log = state.tiers[i]
  if log == nil then
    return 0
  end
  return log_count(log.hits, now, policy.tiers[i].window)
end

-- The current tier (0 when none is active).
local function current_tier(policy, state, now)
  for i = #policy.tiers, 1, -1 do
    if phase(policy.tiers[i], tier_entered(state, i), now) == ACTIVE then
      return i
    end
  end
  return 0
end

-- A token bucket instead of tiers (src/engine/gcra.rs): ticks from now to
-- its TAT (0 if passed, or of another rate).
local function bucket_ahead(gcra, state, now)
  local b = state.bucket
  if b == nil or b.count ~= gcra.count then
    return 0
  end
  return math.max(0, (b.ms - now) * gcra.count + b.ticks)
end

local function tier_room(policy, state, asked, now)
  local gcra = policy.gcra
  if gcra ~= nil then
    local space = gcra.burst * gcra.period - bucket_ahead(gcra, state, now)
    return math.max(0, math.floor(space / gcra.period))
  end
  local current = current_tier(policy, state, now)
  local room = 0
  if current > 0 then
    room = math.max(0, policy.tiers[current].limit - tier_count(policy, state, current, now))
  end
  for i = current + 1, #policy.tiers do
    if room >= asked then
      break
    end
    local tier = policy.tiers[i]
    local p = phase(tier, tier_entered(state, i), now)
    if p == COOLDOWN then
      if not tier.skippable then
        break
      end
    else
      room = room + tier.limit
    end
  end
  return room
end

local function room(item, state, global, asked, now)
  local policy = item.policy
  local grantable = math.min(asked, tier_room(policy, state, asked, now))
  if policy.hard ~= INF then
    grantable = math.min(grantable, math.max(0, policy.hard - log_count(state.recent, now, SECOND)))
  end
  if global ~= nil then
    grantable = math.min(grantable, math.max(0, item.global_limit - log_count(global, now, SECOND)))
  end
  return grantable
end

local function tiers_expiry(policy, state)
  local until_ = log_counts_until(state.recent, SECOND)
  local b = state.bucket
  if policy.gcra ~= nil and b ~= nil then
    local full = b.ms
    if b.ticks > 0 then
      full = full + 1
    end
    until_ = math.max(until_, full)
  end
  for i = 1, #policy.tiers do
    local tier, log = policy.tiers[i], state.tiers[i]
    if log.entered ~= nil then
      if tier.active == INF then
        if i > 1 then
          return INF
        end
      else
        until_ = math.max(until_, log.entered + tier.active + tier.cooldown)
      end
    end
    local last = log.hits.last_t
    if last ~= nil then
      until_ = math.max(until_, last + tier.window + 1)
    end
  end
  return until_
end

local function grant(policy, state, global, k, now)
  local gcra = policy.gcra
  if gcra ~= nil then
    local next = bucket_ahead(gcra, state, now) + k * gcra.period
    local ticks = math.fmod(next, gcra.count)
    state.bucket = { ms = now + (next - ticks) / gcra.count, ticks = ticks, count = gcra.count }
  end
  local tiers = policy.tiers
  for i = 1, #tiers do
    local log = state.tiers[i]
    if log == nil then
      log = { hits = log_new() }
      state.tiers[i] = log
    end
    if phase(tiers[i], log.entered, now) == INACTIVE then
      log.entered = nil
      log_clear(log.hits)
    else
      log_prune(log.hits, now, tiers[i].window)
    end
  end
  for i = #state.tiers, #tiers + 1, -1 do
    state.tiers[i] = nil
  end
  log_prune(state.recent, now, SECOND)
  local current = current_tier(policy, state, now)
  local left = k
  if current > 0 then
    local log = state.tiers[current]
    local space = math.max(0, tiers[current].limit - log_count(log.hits, now, tiers[current].window))
    local take = math.min(left, space)
    log_push(log.hits, now, take)
    left = left - take
  end
  for i = current + 1, #tiers do
    if left == 0 then
      break
    end
    local tier, log = tiers[i], state.tiers[i]
    local p = phase(tier, log.entered, now)
    if p == COOLDOWN then
      if not tier.skippable then
        break
      end
    else
      log.entered = now
      log_clear(log.hits)
      local take = math.min(left, tier.limit)
      log_push(log.hits, now, take)
      left = left - take
    end
  end
  log_push(state.recent, now, k)
  if global ~= nil then
    log_prune(global, now, SECOND)
    log_push(global, now, k)
  end
  state.exp = tiers_expiry(policy, state)
end

-- The batch.

local injected = tonumber(ARGV[1])
local now
-- Spreads the expiry of window keys, as in window.lua (which says why).
local spread = 0
if injected ~= 0 then
  now = injected
else
  local time = redis.call('TIME')
  local micros = tonumber(time[2])
  now = tonumber(time[1]) * 1000 + math.floor(micros / 1000)
  spread = math.fmod(micros, 1000) / 1000
end
-- Injected (virtual) time runs faster or slower than Redis's own clock, which
-- expires keys: give keys a day of slack then, so state outlives its virtual
-- relevance (reads ignore expired state anyway).
local slack = 0
if injected ~= 0 then
  slack = 86400000
end

local kinds = ARGV[2]
local raw, slots, dirty, fresh_window = {}, {}, {}, {}
for i = 1, #KEYS do
  local kind = string.sub(kinds, i, i)
  local value = redis.call('GET', KEYS[i])
  raw[i] = value
  if kind == 'w' then
    slots[i] = window_decode(value, now)
  elseif kind == 'a' then
    slots[i] = gcra_decode(value)
  elseif kind == 't' then
    slots[i] = tiers_decode(value, now)
  elseif kind == 'c' then
    slots[i] = cost_decode(value, now)
  elseif kind == 's' then
    slots[i] = sliding_decode(value, now)
  elseif kind == 'h' then
    slots[i] = hybrid_decode(value, now)
  elseif kind == 'l' then
    slots[i] = slog_decode(value, now)
  elseif kind == 'b' then
    slots[i] = ban_decode(value, now)
  elseif kind == 'g' then
    slots[i] = global_decode(value, now)
  else
    return redis.error_reply('charon: unknown kind of state ' .. kind)
  end
end

-- Whether a window item from ARGV[at] on counts rejected hits: then a
-- rejection cannot end the loop early, since those hits are recorded anyway.
local function counting_later(at)
  while at <= #ARGV do
    local kind = ARGV[at]
    if kind == 'w' or kind == 'l' then
      if tonumber(ARGV[at + 5]) >= 2 then
        return true
      end
      at = at + 6
    elseif kind == 'a' then
      at = at + 7
    elseif kind == 'c' then
      if ARGV[at + 7] == 'h' and tonumber(ARGV[at + 4]) > 0 then
        return true
      end
      at = at + 11
    elseif kind == 's' or kind == 'h' then
      at = at + 6
    elseif kind == 'b' then
      if tonumber(ARGV[at + 5]) > 0 then
        return true
      end
      at = at + 7
    elseif kind == 'k' then
      if num(ARGV[at + 5]) > 0 then
        return true
      end
      at = at + 7
    elseif kind == 'r' then
      at = at + 7
    else
      at = at + 10 + 5 * tonumber(ARGV[at + 9]) + 3
    end
  end
  return false
end

local granted = true
-- Windows that count rejected hits: per slot, the hits kept even if the
-- batch is rejected, and their window.
local kept, kept_start, kept_period = {}, {}, {}
-- Costs: per slot, the charges (hits, period) kept even if the batch is
-- rejected, in order; sliding logs counting rejected hits likewise.
local charges, logged, tripped = {}, {}, {}
-- Concurrency limits: every hit asked, {owed_slot, max_hold, hits}: all are
-- owed their refunds if the batch is refused.
local owing = {}
local at = 4
for _ = 1, tonumber(ARGV[3]) do
  local over, shadow
  if ARGV[at] == 'w' then
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local flags = tonumber(ARGV[at + 5])
    local counting = flags >= 2
    shadow = flags % 2 == 1
    at = at + 6
    local state = slots[slot]
    local start = now - math.fmod(now, math.max(period, 1))
    local count = 0
    if state.start == start then
      count = state.count
    end
    over = count + math.max(hits, 1) > limit
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
        kept[slot], kept_start[slot], kept_period[slot] = (kept[slot] or 0) + hits, start, period
      end
    end
  elseif ARGV[at] == 's' then
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    shadow = ARGV[at + 5] == '1'
    at = at + 6
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
    over = estimate + math.max(hits, 1) > limit
    if not over and hits > 0 then
      slots[slot] = { start = start, current = current + hits, previous = previous, exp = start + 2 * period }
      dirty[slot] = true
    end
  elseif ARGV[at] == 'b' then
    local slot, limit, window, duration = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local hits = num(ARGV[at + 5])
    shadow = ARGV[at + 6] == '1'
    at = at + 7
    local record
    over, record = ban_decide(slots[slot], limit, window, duration, hits, now)
    if record ~= nil then
      slots[slot] = record
      dirty[slot] = true
      if over then
        -- A trip is recorded whatever the verdict: replayed on the stored
        -- state if the batch is refused.
        tripped[slot] = tripped[slot] or {}
        table.insert(tripped[slot], { limit, window, duration, hits })
      end
    end
  elseif ARGV[at] == 'l' then
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    local flags = tonumber(ARGV[at + 5])
    local counting = flags >= 2
    shadow = flags % 2 == 1
    at = at + 6
    local state = slots[slot]
    over = log_count(state.log, now, period) + math.max(hits, 1) > limit
    if hits > 0 and (counting or not over) then
      slog_record(state, limit, period, hits, now)
      dirty[slot] = true
      if counting then
        logged[slot] = logged[slot] or {}
        table.insert(logged[slot], { hits, period, limit })
      end
    end
  elseif ARGV[at] == 'h' then
    local slot, quota, window, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    shadow = ARGV[at + 5] == '1'
    at = at + 6
    local after
    over, after = hybrid_decide(slots[slot], quota, window, hits, now)
    if not over and hits > 0 then
      slots[slot] = after
      dirty[slot] = true
    end
  elseif ARGV[at] == 'c' then
    local slot, limit, period, hits = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3]), num(ARGV[at + 4])
    shadow = ARGV[at + 5] == '1'
    local initial = num(ARGV[at + 6])
    local op, id, extra, charge_on_expiry = ARGV[at + 7], ARGV[at + 8], num(ARGV[at + 9]), ARGV[at + 10] == '1'
    at = at + 11
    local state = slots[slot]
    if op == 'h' and hits > 0 then
      over = false
      cost_charge(state, period, hits, now)
      charges[slot] = charges[slot] or {}
      table.insert(charges[slot], { hits, period })
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
  elseif ARGV[at] == 'k' then
    local slot, owed, limit = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), num(ARGV[at + 3])
    local hold, hits = num(ARGV[at + 4]), num(ARGV[at + 5])
    shadow = ARGV[at + 6] == '1'
    at = at + 7
    local state = slots[slot]
    held_prune(state, hold, now)
    dirty[slot] = true
    over = state.log.total + math.max(hits, 1) > limit
    if hits > 0 then
      if over then
        slots[owed] = owe(slots[owed], hold, hits, now)
        dirty[owed], fresh_window[owed] = true, true
      else
        slog_record(state, limit, hold, hits, now)
        held_keep(state, hold)
      end
      owing[#owing + 1] = { owed, hold, hits }
    end
  elseif ARGV[at] == 'r' then
    local slot, of, hits = tonumber(ARGV[at + 1]), ARGV[at + 2], num(ARGV[at + 3])
    local a, b, c = num(ARGV[at + 4]), num(ARGV[at + 5]), num(ARGV[at + 6])
    at = at + 7
    over, shadow = false, true
    local state = slots[slot]
    if of == 'w' then
      if state.start == now - math.fmod(now, math.max(b, 1)) then
        state.count = math.max(state.count - hits, 0)
        dirty[slot] = true
      end
    elseif of == 's' then
      if state.start == now - math.fmod(now, math.max(b, 1)) then
        state.current = math.max(state.current - hits, 0)
        dirty[slot] = true
      end
    elseif of == 'l' then
      log_prune(state.log, now, b)
      if state.log.total > 0 then
        log_trim(state.log, math.max(state.log.total - hits, 0))
        state.exp = log_counts_until(state.log, b)
        dirty[slot] = true
      end
    elseif of == 'a' then
      if a ~= 0 and b ~= 0 and state.count == a then
        local ahead = (state.ms - now) * a + state.ticks
        if ahead > 0 then
          ahead = math.max(ahead - hits * b, 0)
          local ticks = math.fmod(ahead, a)
          slots[slot] = { ms = now + (ahead - ticks) / a, ticks = ticks, count = a }
          dirty[slot] = true
        end
      end
    elseif of == 'c' then
      if hits > 0 then
        cost_settle(state, b, now)
        state.used = math.max(state.used - hits, 0)
        cost_touch(state, b, now)
        dirty[slot] = true
      end
    elseif of == 'k' then
      local owed = slots[a]
      held_prune(state, c, now)
      dirty[slot] = true
      local paid = 0
      if owed.exp > now then
        paid = math.min(owed.count, hits)
      end
      if paid > 0 then
        owed.count = owed.count - paid
        dirty[a] = true
      end
      log_trim(state.log, math.max(state.log.total - (hits - paid), 0))
      held_keep(state, c)
    else
      return redis.error_reply('charon: unknown kind of refund ' .. of)
    end
  elseif ARGV[at] == 'a' then
    local slot, count, period = tonumber(ARGV[at + 1]), num(ARGV[at + 2]), num(ARGV[at + 3])
    local burst, hits = num(ARGV[at + 4]), num(ARGV[at + 5])
    shadow = ARGV[at + 6] == '1'
    at = at + 7
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
  else
    local item = {
      slot = tonumber(ARGV[at + 1]),
      global_slot = tonumber(ARGV[at + 2]),
      global_limit = num(ARGV[at + 3]),
      copies = num(ARGV[at + 4]),
      min_copies = num(ARGV[at + 5]),
      check_only = ARGV[at + 6] == '1',
      policy = { hard = num(ARGV[at + 8]), tiers = {} },
    }
    shadow = ARGV[at + 7] == '1'
    local ntiers = tonumber(ARGV[at + 9])
    at = at + 10
    for i = 1, ntiers do
      item.policy.tiers[i] = {
        limit = num(ARGV[at]),
        window = num(ARGV[at + 1]),
        active = num(ARGV[at + 2]),
        cooldown = num(ARGV[at + 3]),
        skippable = ARGV[at + 4] == '1',
      }
      at = at + 5
    end
    local gcra_count = num(ARGV[at])
    if gcra_count > 0 then
      item.policy.gcra = { count = gcra_count, period = num(ARGV[at + 1]), burst = num(ARGV[at + 2]) }
    end
    at = at + 3
    local state = slots[item.slot]
    local global = nil
    if item.global_slot > 0 then
      global = slots[item.global_slot]
    end
    local asked, needed = item.copies, item.min_copies
    if item.check_only then
      asked, needed = 1, 1
    end
    local grantable = room(item, state, global, asked, now)
    over = grantable < needed
    if not over and not item.check_only and grantable > 0 then
      grant(item.policy, state, global, grantable, now)
      dirty[item.slot] = true
      if global ~= nil then
        dirty[item.global_slot] = true
      end
    end
  end
  if over and not shadow then
    granted = false
    if next(kept) == nil and next(charges) == nil and next(logged) == nil and next(tripped) == nil and
        not counting_later(at) then
      break
    end
  end
end

if not granted then
  -- Rejected: the original windows plus the hits that count anyway.
  for i = 1, #KEYS do
    dirty[i] = false
    if kept[i] then
      local state = window_decode(raw[i], now)
      if state.start ~= kept_start[i] then
        state = { start = kept_start[i], count = 0 }
        fresh_window[i] = true
      else
        fresh_window[i] = false
      end
      state.count = state.count + kept[i]
      state.exp = kept_start[i] + kept_period[i]
      state.period = kept_period[i]
      slots[i], dirty[i] = state, true
    elseif charges[i] then
      local state = cost_decode(raw[i], now)
      for _, charge in ipairs(charges[i]) do
        cost_charge(state, charge[2], charge[1], now)
      end
      slots[i], dirty[i] = state, true
    elseif tripped[i] then
      local state = ban_decode(raw[i], now)
      for _, trip in ipairs(tripped[i]) do
        local over, record = ban_decide(state, trip[1], trip[2], trip[3], trip[4], now)
        if over and record ~= nil then
          state = record
        end
      end
      slots[i], dirty[i] = state, true
    elseif logged[i] then
      local state = slog_decode(raw[i], now)
      for _, hit in ipairs(logged[i]) do
        slog_record(state, hit[3], hit[2], hit[1], now)
      end
      slots[i], dirty[i] = state, true
    end
  end
  -- Concurrency limits: no hit held, every one owed its refund.
  local owed_from_raw = {}
  for _, o in ipairs(owing) do
    local i = o[1]
    if not owed_from_raw[i] then
      slots[i], owed_from_raw[i] = window_decode(raw[i], now), true
    end
    slots[i] = owe(slots[i], o[2], o[3], now)
    dirty[i], fresh_window[i] = true, true
  end
end

do
  for i = 1, #KEYS do
    if dirty[i] then
      local kind, state = string.sub(kinds, i, i), slots[i]
      if kind == 'a' then
        local value = fmt(state.ms) .. ',' .. fmt(state.ticks) .. ',' .. fmt(state.count)
        local until_ms = state.ms - now
        if state.ticks > 0 then
          until_ms = until_ms + 1
        end
        redis.call('SET', KEYS[i], value, 'PX', math.max(until_ms, 1) + slack)
      elseif kind == 'w' then
        local value = fmt(state.start) .. ',' .. fmt(state.count) .. ',' .. fmt(state.exp)
        if fresh_window[i] then
          local late = math.floor(spread * math.min(state.period, 60000))
          redis.call('SET', KEYS[i], value, 'PX', state.exp - now + slack + late)
        else
          -- Same window: its expiry is already right.
          redis.call('SET', KEYS[i], value, 'KEEPTTL')
        end
      elseif kind == 'c' then
        redis.call('SET', KEYS[i], cost_encode(state), 'PX', state.exp - now + slack)
      elseif kind == 'b' then
        local value = fmt(state.start) .. ',' .. fmt(state.count) .. ',' .. fmt(state.banned) .. ',' .. fmt(state.exp)
        redis.call('SET', KEYS[i], value, 'PX', math.max(state.exp - now, 1) + slack)
      elseif kind == 'l' then
        redis.call('SET', KEYS[i], fmt(state.exp) .. '|' .. log_encode(state.log), 'PX', math.max(state.exp - now, 1) + slack)
      elseif kind == 'h' then
        local value = state.mode .. ',' .. fmt(state.time) .. ',' .. fmt(state.bucket) .. ',' .. fmt(state.exp)
        redis.call('SET', KEYS[i], value, 'PX', math.max(state.exp - now, 1) + slack)
      elseif kind == 's' then
        local value = fmt(state.start) .. ',' .. fmt(state.current) .. ',' .. fmt(state.previous) .. ',' .. fmt(state.exp)
        redis.call('SET', KEYS[i], value, 'PX', state.exp - now + slack)
      elseif kind == 't' then
        if state.exp == INF then
          redis.call('SET', KEYS[i], tiers_encode(state))
        else
          redis.call('SET', KEYS[i], tiers_encode(state), 'PX', state.exp - now + slack)
        end
      else
        redis.call('SET', KEYS[i], log_encode(state), 'PX', log_counts_until(state, SECOND) - now + slack)
      end
    end
  end
end

local reply = { now, granted and 1 or 0 }
for i = 1, #KEYS do
  reply[i + 2] = raw[i]
end
return reply
