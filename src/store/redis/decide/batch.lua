-- The batch: the keys' states, each item in order, and what is written.

local kinds = ARGV[2]
local raw = {}
for i = 1, #KEYS do
  local kind = string.sub(kinds, i, i)
  local decode = need(kind) and DECODE[kind]
  if not decode then
    return redis.error_reply('charon: unknown kind of state ' .. kind)
  end
  local value = redis.call('GET', KEYS[i])
  raw[i] = value
  slots[i] = decode(value, now)
end

-- Whether an item from ARGV[at] on records hits in a refused batch: then a
-- rejection cannot end the loop early, since those hits are recorded anyway.
local function counting_later(at)
  while at <= #ARGV do
    local kind = ARGV[at]
    if kind == 'r' then
      at = at + 7
    else
      local later = need(kind) and LATER[kind]
      if not later then
        return false
      end
      local counts
      counts, at = later(at)
      if counts then
        return true
      end
    end
  end
  return false
end

local granted = true
local at = 4
for _ = 1, tonumber(ARGV[3]) do
  local over, shadow
  local kind = ARGV[at]
  if kind == 'r' then
    -- A refund: never over, applied with its batch.
    local slot, of, hits = tonumber(ARGV[at + 1]), ARGV[at + 2], num(ARGV[at + 3])
    local give_back = need(of) and REFUND[of]
    if not give_back then
      return redis.error_reply('charon: unknown kind of refund ' .. tostring(of))
    end
    give_back(slot, hits, num(ARGV[at + 4]), num(ARGV[at + 5]), num(ARGV[at + 6]))
    at = at + 7
    over, shadow = false, true
  else
    local decide = need(kind) and ITEM[kind]
    if not decide then
      return redis.error_reply('charon: unknown kind of item ' .. tostring(kind))
    end
    over, shadow, at = decide(at)
  end
  if over and not shadow then
    granted = false
    if next(refused) == nil and not counting_later(at) then
      break
    end
  end
end

if not granted then
  -- Refused: the states as they were, plus the hits that count anyway.
  for i = 1, #KEYS do
    dirty[i] = false
    local record = refused[i]
    if record ~= nil then
      slots[i], dirty[i] = REPLAY[record.kind](raw[i], record, i), true
    end
  end
end

for i = 1, #KEYS do
  if dirty[i] then
    ENCODE[string.sub(kinds, i, i)](i, slots[i])
  end
end

local reply = { now, granted and 1 or 0 }
for i = 1, #KEYS do
  reply[i + 2] = raw[i]
end
return reply
