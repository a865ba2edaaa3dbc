-- apply_anchor.lua: the public-API mode writes Polar's figure of one customer meter (the anchor)
-- into the identity's state hash, and removes the pending events the figure provably includes.
-- The caller decided everything from the state hash and the pending events it read (the prune
-- rule of the public mode); this script only checks that nothing moved since and applies.
--
-- KEYS[1]  the identity's state hash (reducer = the meter: one reducer per meter)
-- KEYS[2]  its acknowledged set (the bucket hashes are derived from the state key: lib.lua)
-- ARGV[1]  the shard's channel
-- ARGV[2]  the revision the caller read ("": the hash did not exist): compare-and-set
-- ARGV[3]  the revision the caller's copy holds (-1: none), for the reply's shape
-- ARGV[4]  the meter id; ARGV[5] its credited units (field "c:<meter id>")
-- ARGV[6]  p: Polar's consumed as an aggregate "count sum min max"
-- ARGV[7]  cu (always "0": every local event stays pending until pruned)
-- ARGV[8]  sa: the figure's modified_at (µs; "0" when Polar's was null)
-- ARGV[9]  sid ("public"); ARGV[10] pub: the ledger's persistent part (JSON, kept as it is)
-- ARGV[11] k, then k events fields to remove (the pruned events)
--
-- Reply: {"conflict": "<revision now>"} when `rev` is not ARGV[2] (a track, an acknowledgement
-- or another instance's anchor came in between): nothing is written, the caller reads again.
-- Otherwise the fields are written, the events removed (their buckets rebuilt, `n`, `u` and the
-- acknowledged set kept right), `rev` bumped, and the change published and replied as every
-- script does: JSON {"c": [change]}.

local st, acked = KEYS[1], KEYS[2]
local current = redis.call("HGET", st, "rev")
if (current or "") ~= ARGV[2] then
  return cjson.encode({ conflict = current or "" })
end
local known, k = tonumber(ARGV[3]), tonumber(ARGV[11])
local buckets, undelivered = {}, 0
for j = 12, 11 + k do
  undelivered = undelivered + remove_event(st, acked, ARGV[j], buckets)
end
local set = {
  "p", ARGV[6], "c:" .. ARGV[4], ARGV[5], "cu", ARGV[7], "sa", ARGV[8], "sid", ARGV[9],
  "pub", ARGV[10],
}
redis.call("HSET", st, unpack(set))
local del = {}
rebuild(st, buckets, undelivered, set, del)
local rev = next_rev(current)
redis.call("HSET", st, "rev", fmt(rev))
touch(st, acked)
local reply, publish = {}, {}
record(reply, publish, st, rev, known, set, del)
return finish(ARGV[1], reply, publish)
