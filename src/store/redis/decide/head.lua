-- Charon: one atomic decision on Redis.
--
-- The same decision as the Rust engine (src/engine), on the state of KEYS, at
-- Redis TIME: every sidecar sharing this Redis reads one clock. The script only
-- decides and records; the sidecar rebuilds the detailed answer (remaining,
-- reset, retry-after, tier context) by running the Rust engine on the state
-- this script returns, which is the state it decided on.
--
-- It is assembled (build.rs) from this head, one chunk per kind of limit
-- (src/store/redis/kinds/*.lua, each beside the Rust that writes its
-- arguments and reads its state back) and the batch (decide/batch.lua):
-- still one script, one EVALSHA, atomic.
--
-- KEYS: the state keys of the batch.
-- ARGV[1]: "0" to read Redis TIME, or an injected time in ms (tests only).
-- ARGV[2]: one state letter per key (each kind's chunk names its own: w
--   fixed window, t tiers, g global log, a GCRA, c cost, s sliding window
--   counter, h hybrid, l sliding window log, b ban), then the letters of
--   the kinds whose functions the items use (their own, and the kinds
--   their chunks `need`).
-- ARGV[3]: number of items, then the items, each a letter, its slot and its
--   numbers, as its kind's chunk documents them; and refunds:
--   r slot of hits a b c (applied with its batch, to a limit of the kind
--     `of`, whose chunk says what a b c are).
-- Slots are 1-based; -1 means "none" for limits and "forever" for durations.
--
-- Returns {now, granted (0/1), value of KEYS[1] before, value of KEYS[2] ...}.
-- States are written in decimal, compactly; each chunk documents its own
-- encoding, which src/store/redis/kinds/<kind>.rs decodes.

local INF = math.huge
local SECOND = 1000

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

-- Each kind's chunk defines LOAD[item letter], which makes the kind's
-- functions and registers them by letter (a state's letter in ARGV[2], an
-- item's in the items):
--   DECODE[state](raw, now): the state, fresh when absent or expired (as the
--     memory store treats it);
--   ENCODE[state](i, state): writes KEYS[i] with its expiry;
--   ITEM[item](at): decides the item at ARGV[at] (recording what passes in
--     `slots` and `dirty`); returns over, shadow, and where the next starts;
--   LATER[item](at): whether the item at ARGV[at] records hits even in a
--     refused batch, and where the next starts;
--   REFUND[item](slot, hits, a, b, c): gives hits back to a limit of it;
--   REPLAY[item](raw, record, i): in a refused batch, the stored state of
--     KEYS[i] with what counts anyway (`refused[i]`, which its ITEM wrote).
-- A state whose letter is not its kind's says whose it is in OWNER.
--
-- Redis runs the whole script on every call, and making a function costs
-- it time (more, the more variables it captures): a kind's LOAD is made
-- only when ARGV[2] names the kind (`WANT`), and its functions only when a
-- batch needs them (`need`), not every kind's on every call.
local LOAD, OWNER = {}, {}
local WANT = {}
for i = 1, #ARGV[2] do
  WANT[string.sub(ARGV[2], i, i)] = true
end
local DECODE, ENCODE, ITEM, LATER, REFUND, REPLAY = {}, {}, {}, {}, {}, {}
local loaded = {}

-- Makes kind `letter`'s functions, once per call; false for a letter no
-- chunk knows.
local function need(letter)
  local kind = OWNER[letter] or letter
  if loaded[kind] then
    return true
  end
  local load = LOAD[kind]
  if load == nil then
    return false
  end
  loaded[kind] = true
  load()
  return true
end

-- The batch's clock.
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

-- The batch's state, per slot: decoded, to be written, a window started
-- here (its key's expiry is set anew), and what a refused batch records
-- anyway ({kind = item letter, ...}, see REPLAY).
local slots, dirty, fresh_window, refused = {}, {}, {}, {}
