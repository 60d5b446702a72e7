-- Hit logs, kept as their encoded text "total~t:n,t:n,..." (times in
-- order, hits granted at each). A busy log holds an entry per millisecond
-- of its window, and Redis's Lua hashes every byte of every string it makes
-- (docs/redis.md#what-a-decision-costs-redis): so a log is read as a view
-- of the text it came in, `src` from `s` to `e`, and copied once, when it
-- is written back. What changes sits beside the view: `first`, the oldest
-- entry when a trim cut into it; `mid`, the entries pushed since (from
-- index `m` on); and the newest entry, `last_t` and `last_n`, which a push
-- in the same millisecond raises. Counting and dropping what expired read
-- only the head, so a decision costs what expired since the last one, not
-- everything the log holds. A log without "total~" (written by an older
-- script) is summed once when read.

local function log_new()
  return { s = 1, e = 0, m = 1, total = 0 }
end

local function log_clear(log)
  log.s, log.e, log.m, log.total = 1, 0, 1, 0
  -- Only fields that are there: setting an absent one, even to nil, grows
  -- the table.
  if log.last_t ~= nil then
    log.src, log.last_t, log.last_n = nil, nil, nil
  end
  if log.mid ~= nil then
    log.mid = nil
  end
  if log.first ~= nil then
    log.first = nil
  end
end

-- The log written in src[s..e], without copying it.
local function log_view(src, s, e)
  local log = log_new()
  if src == nil or s > e then
    return log
  end
  local total, body = string.match(src, '^(%d+)~()', s)
  if total == nil then
    total, body = 0, s
    for n in string.gmatch(string.sub(src, s, e), ':(%d+)') do
      total = total + tonumber(n)
    end
  end
  if body > e then
    return log
  end
  -- Where the last entry starts (an entry is short: look near the end
  -- first).
  local last, from = nil, e
  repeat
    from = math.max(body, from - 64)
    local at = from
    while true do
      local comma = string.find(src, ',', at, true)
      if comma == nil or comma > e then
        break
      end
      last, at = comma + 1, comma + 1
    end
  until last ~= nil or from == body
  last = last or body
  local t, n = string.match(src, '^(%d+):(%d+)', last)
  log.src, log.s, log.e = src, body, last - 2
  log.total, log.last_t, log.last_n = tonumber(total), tonumber(t), tonumber(n)
  return log
end

-- Appends the log's text to `parts` (nothing when it is empty): one part,
-- or three around a long view, which `set_parts` appends as it is.
local function log_parts(log, parts)
  if log.last_t == nil then
    return parts
  end
  local head = fmt(log.total) .. '~'
  if log.first ~= nil then
    head = head .. fmt(log.first[1]) .. ':' .. fmt(log.first[2]) .. ','
  end
  local tail = fmt(log.last_t) .. ':' .. fmt(log.last_n)
  local mid = log.mid
  if mid ~= nil then
    for i = #mid, log.m, -1 do
      tail = fmt(mid[i][1]) .. ':' .. fmt(mid[i][2]) .. ',' .. tail
    end
  end
  if log.s > log.e then
    parts[#parts + 1] = head .. tail
  elseif log.e - log.s < 4096 then
    parts[#parts + 1] = head .. string.sub(log.src, log.s, log.e) .. ',' .. tail
  else
    parts[#parts + 1] = head
    parts[#parts + 1] = string.sub(log.src, log.s, log.e)
    parts[#parts + 1] = ',' .. tail
    parts.long = true
  end
  return parts
end

-- Writes KEYS[i] as `parts` joined, with SET's options `...`. Joined, a
-- busy log's text would be one more long string for Lua to make and hash:
-- then the long parts (the logs read in place) are appended as they are.
local function set_parts(i, parts, ...)
  if not parts.long then
    redis.call('SET', KEYS[i], table.concat(parts), ...)
    return
  end
  local chunks, short = {}, {}
  for p = 1, #parts do
    if #parts[p] > 4096 then
      chunks[#chunks + 1] = table.concat(short)
      chunks[#chunks + 1], short = parts[p], {}
    else
      short[#short + 1] = parts[p]
    end
  end
  chunks[#chunks + 1] = table.concat(short)
  redis.call('SET', KEYS[i], chunks[1], ...)
  for c = 2, #chunks do
    if chunks[c] ~= '' then
      redis.call('APPEND', KEYS[i], chunks[c])
    end
  end
end

-- Hits of the head that no longer count in a window of span w at now (a hit
-- at t counts while now <= t + w); then where what still counts starts: the
-- view's position, mid's index, and whether `first` and the newest entry
-- went.
local function log_expired(log, now, window)
  if log.last_t == nil then
    return 0, log.s, log.m, false, false
  end
  local expired, first_gone = 0, false
  local first = log.first
  if first ~= nil then
    if first[1] + window >= now then
      return 0, log.s, log.m, false, false
    end
    expired, first_gone = first[2], true
  end
  local src, at, e = log.src, log.s, log.e
  while at <= e do
    local t, n, next_at = string.match(src, '^(%d+):(%d+),?()', at)
    if tonumber(t) + window >= now then
      return expired, at, log.m, first_gone, false
    end
    expired, at = expired + tonumber(n), next_at
  end
  local mid, m = log.mid, log.m
  while mid ~= nil and m <= #mid do
    if mid[m][1] + window >= now then
      return expired, at, m, first_gone, false
    end
    expired, m = expired + mid[m][2], m + 1
  end
  local last_gone = log.last_t ~= nil and log.last_t + window < now
  if last_gone then
    expired = expired + log.last_n
  end
  return expired, at, m, first_gone, last_gone
end

local function log_count(log, now, window)
  local expired = log_expired(log, now, window)
  return log.total - expired
end

local function log_prune(log, now, window)
  local expired, at, m, first_gone, last_gone = log_expired(log, now, window)
  if expired == 0 then
    return
  end
  if first_gone then
    log.first = nil
  end
  log.s, log.m = at, m
  if last_gone then
    log.last_t, log.last_n = nil, nil
  end
  log.total = log.total - expired
end

local function log_push(log, now, n)
  if n == 0 then
    return
  end
  if log.last_t ~= nil and log.last_t >= now then
    log.last_n = log.last_n + n
  else
    if log.last_t ~= nil then
      local mid = log.mid or {}
      mid[#mid + 1] = { log.last_t, log.last_n }
      log.mid = mid
    end
    log.last_t, log.last_n = now, n
  end
  log.total = log.total + n
end

-- Keeps the `limit` most recent hits (the oldest go first, part of an
-- instant's if need be).
local function log_trim(log, limit)
  while log.total > limit do
    local excess = log.total - limit
    -- The oldest entry, taken off the head.
    local t, n, newest = nil, nil, false
    if log.last_t == nil then
      log_clear(log)
      return
    elseif log.first ~= nil then
      t, n = log.first[1], log.first[2]
      log.first = nil
    elseif log.s <= log.e then
      local ts, ns, next_at = string.match(log.src, '^(%d+):(%d+),?()', log.s)
      t, n, log.s = tonumber(ts), tonumber(ns), next_at
    elseif log.mid ~= nil and log.m <= #log.mid then
      t, n = log.mid[log.m][1], log.mid[log.m][2]
      log.m = log.m + 1
    else
      t, n, newest = log.last_t, log.last_n, true
      log.last_t, log.last_n = nil, nil
    end
    if n <= excess then
      log.total = log.total - n
    else
      if newest then
        log.last_t, log.last_n = t, n - excess
      else
        log.first = { t, n - excess }
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
        return { exp = exp, log = log_view(raw, bar + 1, #raw) }
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
  set_parts(i, log_parts(state.log, { fmt(state.exp), '|' }), 'PX', math.max(state.exp - now, 1) + slack)
end
