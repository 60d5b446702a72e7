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

-- Logs of hit times with their expiry, "expires_at|log": a sliding window
-- log's state (src/engine/sliding_log.rs), and a concurrency limit's held
-- hits (src/engine/max_hold.rs).
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

local function slog_encode(i, state)
  redis.call('SET', KEYS[i], fmt(state.exp) .. '|' .. log_encode(state.log), 'PX', math.max(state.exp - now, 1) + slack)
end
