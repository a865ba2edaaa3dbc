-- acknowledge.lua: Polar stored these events. They stay pending (counted locally) until a
-- snapshot counts them, so a snapshot computed before the acknowledgement and applied after it
-- still finds them. The acknowledgement time is recorded, in the event's value and as its score in
-- the acknowledged set: a snapshot that makes the event's bucket cold and still does not count it
-- drops it once an hour has passed since that time.
--
-- KEYS[1]                the shard's outbox stream
-- KEYS[2i], KEYS[2i+1]   state hash and acknowledged set of identity i (the events' bucket
--                        hashes are derived from the state key: lib.lua)
-- ARGV[1]  the shard's channel
-- ARGV[2]  consumer group
-- ARGV[3]  now (µs)
-- ARGV[4]  m, the number of outbox entry ids; ARGV[5..4+m] the ids (acknowledged and deleted)
-- then for each identity: the revision the caller holds (-1: none), k, and k events fields
--
-- Reply: JSON {"c": [change, ...]}. Acknowledging twice changes nothing the second time.

local now = ARGV[3]
local m = tonumber(ARGV[4])
local reply, publish = settle_identities(5 + m, function(st, acked, fields)
  local done, written = 0, {}
  for _, field in ipairs(fields) do
    local b = field_bucket(field)
    local ev = b and bucket_key(st, b)
    local text = ev and redis.call("HGET", ev, field)
    if text and not string.find(text, " ", 1, true) then
      redis.call("HSET", ev, field, text .. " " .. now)
      redis.call("ZADD", acked, now, field)
      written[ev] = true
      done = done + 1
    end
  end
  if done == 0 then
    return nil
  end
  for ev in pairs(written) do
    redis.call("EXPIRE", ev, TTL)
  end
  return { "u", tostring(redis.call("HINCRBY", st, "u", -done)) }, {}
end)
settle_entries(KEYS[1], ARGV[2], 5, 4 + m)
return finish(ARGV[1], reply, publish)
