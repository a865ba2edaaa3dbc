-- release.lua: free one hold (a reservation released, or left without a commit), and prune the
-- hash's expired holds.
--
-- KEYS[1]  the state hash that holds it
-- ARGV[1]  the shard's channel
-- ARGV[2]  now (µs)
-- ARGV[3]  the hold's field, "h:<hold id>"
-- ARGV[4]  the revision of KEYS[1] the caller holds (-1: none)
--
-- Reply: JSON {"c": [change]}, with no change when there was nothing to remove (released twice,
-- or already expired and pruned).

local st = KEYS[1]
local _, _, expired = admission_view({ st }, "count", tonumber(ARGV[2]))
local del = prune_holds(st, expired, {})
if redis.call("HDEL", st, ARGV[3]) == 1 then
  del[#del + 1] = ARGV[3]
end
local reply, publish = {}, {}
if #del > 0 then
  local rev = next_rev(redis.call("HGET", st, "rev"))
  redis.call("HSET", st, "rev", fmt(rev))
  redis.call("EXPIRE", st, TTL)
  record(reply, publish, st, rev, tonumber(ARGV[4]), {}, del)
end
return finish(ARGV[1], reply, publish)
