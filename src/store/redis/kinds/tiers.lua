-- Burst tiers (src/engine/tiers.rs) with hard and global limits, or a
-- token bucket instead of tiers; a resource's global log is the hits it
-- granted in the last second, over every domain.
--   item:  t slot global_slot global_limit copies min_copies check_only
--          shadow hard_limit ntiers (limit window active cooldown
--          skippable)*ntiers gcra_count gcra_period gcra_burst (a token
--          bucket instead of tiers; gcra_count 0 when there is none);
--          global_slot 0 when absent
--   state: t "expires_at|recent log|entered;log|entered;log..." (hit logs,
--          decide/logs.lua) with one "entered;log" per tier, entered empty
--          when the tier is not entered, and "f" for an expiry that never
--          comes; a resource with a token bucket instead of tiers has one
--          "b" field instead: "btat_ms,ticks,count" (as a's state)
--   state: g, a hit log "total~t:n,t:n,..."
OWNER.g = 't'
LOAD.t = WANT.t and function()
  -- A bucket instead of tiers is a's state.
  need('a')
  local ACTIVE, COOLDOWN, INACTIVE = 1, 2, 3

  local function expiry_decode(s)
    if s == 'f' then
      return INF
    end
    return num(s)
  end

  -- Fields are found in place: the logs are read as views of `raw`
  -- (decide/logs.lua says why).
  local function tiers_decode(raw, now)
    if raw then
      local bar = string.find(raw, '|', 1, true) or #raw + 1
      local exp = expiry_decode(string.sub(raw, 1, bar - 1))
      if exp > now then
        local from = bar + 1
        bar = string.find(raw, '|', from, true) or #raw + 1
        local state = { exp = exp, recent = log_view(raw, from, bar - 1), tiers = {} }
        while bar <= #raw do
          from = bar + 1
          bar = string.find(raw, '|', from, true) or #raw + 1
          if string.sub(raw, from, from) == 'b' then
            state.bucket = DECODE.a(string.sub(raw, from + 1, bar - 1))
          else
            local entered, hits = string.match(raw, '^(%d*);()', from)
            local tier = { hits = log_new() }
            if entered ~= nil then
              tier.hits = log_view(raw, hits, bar - 1)
              if entered ~= '' then
                tier.entered = tonumber(entered)
              end
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
    local parts = { fmt(state.exp) .. '|' }
    log_parts(state.recent, parts)
    for i = 1, #state.tiers do
      local tier = state.tiers[i]
      local entered = ''
      if tier.entered ~= nil then
        entered = fmt(tier.entered)
      end
      parts[#parts + 1] = '|' .. entered .. ';'
      log_parts(tier.hits, parts)
    end
    local b = state.bucket
    if b ~= nil then
      parts[#parts + 1] = '|b' .. fmt(b.ms) .. ',' .. fmt(b.ticks) .. ',' .. fmt(b.count)
    end
    return parts
  end

  local function global_decode(raw, now)
    local log = log_view(raw, 1, raw and #raw or 0)
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

  DECODE.t = tiers_decode
  DECODE.g = global_decode

  ENCODE.t = function(i, state)
    if state.exp == INF then
      set_parts(i, tiers_encode(state))
    else
      set_parts(i, tiers_encode(state), 'PX', state.exp - now + slack)
    end
  end

  ENCODE.g = function(i, state)
    set_parts(i, log_parts(state, {}), 'PX', log_counts_until(state, SECOND) - now + slack)
  end

  ITEM.t = function(at)
    local item = {
      slot = tonumber(ARGV[at + 1]),
      global_slot = tonumber(ARGV[at + 2]),
      global_limit = num(ARGV[at + 3]),
      copies = num(ARGV[at + 4]),
      min_copies = num(ARGV[at + 5]),
      check_only = ARGV[at + 6] == '1',
      policy = { hard = num(ARGV[at + 8]), tiers = {} },
    }
    local shadow = ARGV[at + 7] == '1'
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
    local over = grantable < needed
    if not over and not item.check_only and grantable > 0 then
      grant(item.policy, state, global, grantable, now)
      dirty[item.slot] = true
      if global ~= nil then
        dirty[item.global_slot] = true
      end
    end
    return over, shadow, at
  end

  LATER.t = function(at)
    return false, at + 10 + 5 * tonumber(ARGV[at + 9]) + 3
  end
end
