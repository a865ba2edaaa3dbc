-- acknowledge.lua: Polar stored these events. They stay pending (counted locally) until a
-- snapshot counts them, so a snapshot computed before the acknowledgement and applied after it
-- still finds them. The acknowledgement time is recorded: a snapshot that makes the event's bucket
-- cold and still does not count it drops it once an hour has passed since that time.
--
-- KEYS[1]                the shard's outbox stream
-- KEYS[2i], KEYS[2i+1]   state hash and events hash of identity i
-- ARGV[1]  the shard's channel
-- ARGV[2]  consumer group
-- ARGV[3]  now (µs)
-- ARGV[4]  m, the number of outbox entry ids; ARGV[5..4+m] the ids (acknowledged and deleted)
-- then for each identity: the revision the caller holds (-1: none), k, and k events-hash fields
--
-- Reply: JSON {"c": [change, ...]}. Acknowledging twice changes nothing the second time.

local now = ARGV[3]
local m = tonumber(ARGV[4])
local pos = 5 + m
local reply, publish = {}, {}
for i = 1, (#KEYS - 1) / 2 do
  local st, ev = KEYS[2 * i], KEYS[2 * i + 1]
  local known, k = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  local done = 0
  for j = pos + 2, pos + 1 + k do
    local text = redis.call("HGET", ev, ARGV[j])
    if text and not string.find(text, " ", 1, true) then
      redis.call("HSET", ev, ARGV[j], text .. " " .. now)
      done = done + 1
    end
  end
  pos = pos + 2 + k
  if done > 0 then
    local undelivered = redis.call("HINCRBY", st, "u", -done)
    local rev = next_rev(tonumber(redis.call("HGET", st, "rev")))
    redis.call("HSET", st, "rev", fmt(rev))
    touch(st, ev)
    record(reply, publish, st, rev, known, { "u", tostring(undelivered) }, {})
  end
end
settle_entries(KEYS[1], ARGV[2], 5, 4 + m)
return finish(ARGV[1], reply, publish)
