-- confirm.lua: these events were dropped; Polar will never count them. They stop being pending
-- everywhere, hot bucket or cold, and leave their buckets' local aggregates at once.
--
-- KEYS and ARGV as acknowledge.lua (ARGV[3] is unused but kept so both take one shape).
-- Reply: JSON {"c": [change, ...]}. Confirming twice changes nothing the second time.

local m = tonumber(ARGV[4])
local pos = 5 + m
local reply, publish = {}, {}
for i = 1, (#KEYS - 1) / 2 do
  local st, ev = KEYS[2 * i], KEYS[2 * i + 1]
  local known, k = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  local buckets, any = {}, false
  for j = pos + 2, pos + 1 + k do
    if redis.call("HDEL", ev, ARGV[j]) == 1 then
      buckets[field_bucket(ARGV[j])] = true
      any = true
    end
  end
  pos = pos + 2 + k
  if any then
    local set, del = {}, {}
    rebuild(st, ev, buckets, set, del)
    local rev = next_rev(tonumber(redis.call("HGET", st, "rev")))
    redis.call("HSET", st, "rev", fmt(rev))
    touch(st, ev)
    record(reply, publish, st, rev, known, set, del)
  end
end
settle_entries(KEYS[1], ARGV[2], 5, 4 + m)
return finish(ARGV[1], reply, publish)
