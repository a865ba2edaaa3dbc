-- apply_snapshot.lua: replace the buckets before a snapshot's cold_until with Polar's totals.
--
-- KEYS[2i-1], KEYS[2i]  state hash and events hash of identity i (one customer, same shard)
-- ARGV[1]  the shard's channel
-- ARGV[2]  now (µs)
-- ARGV[3]  how long (µs) an acknowledged event that no snapshot counts stays pending
-- ARGV[4]  cold_until (µs), ARGV[5] as_of (µs), ARGV[6] snapshot id
-- ARGV[7]  m, then m pairs: meter id, credited units (every meter of the snapshot)
-- then for each identity: the revision the caller holds (-1: none), Polar's aggregate before
-- cold_until, k, and the k events-hash fields this snapshot counts
--
-- A snapshot older than the one applied (cold_until lower, or equal with an as_of not later)
-- changes nothing, so applying is idempotent and never moves cold_until backwards. Events of the
-- buckets before cold_until that the snapshot does not count stay pending; acknowledged ones for
-- at most ARGV[3]. Reply: JSON {"c": [change, ...]}.

local now, keep = tonumber(ARGV[2]), tonumber(ARGV[3])
local cold, as_of, sid = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local m = tonumber(ARGV[7])
local credits = {}
for j = 8, 7 + 2 * m, 2 do
  credits["c:" .. ARGV[j]] = ARGV[j + 1]
end
local pos = 8 + 2 * m
local reply, publish = {}, {}
for i = 1, #KEYS / 2 do
  local st, ev = KEYS[2 * i - 1], KEYS[2 * i]
  local known, polar, k = tonumber(ARGV[pos]), ARGV[pos + 1], tonumber(ARGV[pos + 2])
  local first, last = pos + 3, pos + 2 + k
  pos = last + 1
  local state = redis.call("HGETALL", st)
  local old = {}
  for j = 1, #state, 2 do
    old[state[j]] = state[j + 1]
  end
  local old_cold, old_as_of = tonumber(old["cu"]), tonumber(old["sa"])
  local stale = old_cold and (cold < old_cold or (cold == old_cold and as_of <= old_as_of))
  if not stale then
    for j = first, last do
      if field_bucket(ARGV[j]) < cold then
        redis.call("HDEL", ev, ARGV[j])
      end
    end
    local flat = redis.call("HGETALL", ev)
    local expired = {}
    for j = 1, #flat, 2 do
      local _, acked = event_value(flat[j + 1])
      if acked and field_bucket(flat[j]) < cold and now - acked > keep then
        redis.call("HDEL", ev, flat[j])
        expired[flat[j]] = true
      end
    end
    local set, del = { "cu", fmt(cold), "sa", fmt(as_of), "sid", sid, "p", polar }, {}
    redis.call("HSET", st, "cu", fmt(cold), "sa", fmt(as_of), "sid", sid, "p", polar)
    for f, units in pairs(credits) do
      redis.call("HSET", st, f, units)
      set[#set + 1] = f
      set[#set + 1] = units
    end
    local buckets = {}
    for f in pairs(old) do
      if string.sub(f, 1, 2) == "c:" and not credits[f] then
        redis.call("HDEL", st, f)
        del[#del + 1] = f
      elseif string.sub(f, 1, 2) == "a:" and tonumber(string.sub(f, 3)) < cold then
        buckets[tonumber(string.sub(f, 3))] = true
      end
    end
    for j = 1, #flat, 2 do
      local b = field_bucket(flat[j])
      if b < cold then buckets[b] = true end
    end
    rebuild(st, ev, buckets, set, del, flat, expired)
    local rev = next_rev(tonumber(old["rev"]))
    redis.call("HSET", st, "rev", fmt(rev))
    touch(st, ev)
    record(reply, publish, st, rev, known, set, del)
  end
end
return finish(ARGV[1], reply, publish)
