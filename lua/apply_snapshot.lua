-- apply_snapshot.lua: replace the buckets before a snapshot's cold_until with Polar's totals.
--
-- KEYS[2i-1], KEYS[2i]  state hash and acknowledged set of identity i (one customer, same shard;
--                       the bucket hashes are derived from the state key: lib.lua)
-- ARGV[1]  the shard's channel
-- ARGV[2]  now (µs)
-- ARGV[3]  how long (µs) an acknowledged event that no snapshot counts stays pending
-- ARGV[4]  cold_until (µs), ARGV[5] as_of (µs), ARGV[6] snapshot id
-- ARGV[7]  m, then m pairs: meter id, credited units (every meter of the snapshot)
-- then for each identity: the revision the caller holds (-1: none), Polar's aggregate before
-- cold_until, k, and the k events fields this snapshot counts
--
-- A snapshot older than the one applied (cold_until lower, or equal with an as_of not later)
-- changes nothing, so applying is idempotent and never moves cold_until backwards. Events of the
-- buckets before cold_until that the snapshot does not count stay pending; acknowledged ones for
-- at most ARGV[3]. Reply: JSON {"c": [change, ...]}.
--
-- The work is proportional to what the snapshot changes, not to what the identity holds: the
-- buckets it makes cold (from the old cold_until to the new one, found in the state hash's `a:`
-- fields) are read and rebuilt; the counted events are removed from their buckets, which are
-- rebuilt; the acknowledged events whose keep time ran out come from the acknowledged set (a
-- range of scores), and only those in cold buckets are removed (one in a hot bucket stays in the
-- range, read again by each snapshot until its bucket is cold: only when Polar's cold_until lags
-- more than an hour behind). Hot buckets, and cold ones that lose nothing, are not touched.

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
  local st, acked = KEYS[2 * i - 1], KEYS[2 * i]
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
    local buckets, undelivered = {}, 0
    for j = first, last do
      local b = field_bucket(ARGV[j])
      if b and tonumber(b) < cold then
        undelivered = undelivered + remove_event(st, acked, ARGV[j], buckets)
      end
    end
    local expired = redis.call("ZRANGEBYSCORE", acked, "-inf", "(" .. fmt(now - keep))
    for _, field in ipairs(expired) do
      local b = field_bucket(field)
      if not b or tonumber(b) < cold then
        undelivered = undelivered + remove_event(st, acked, field, buckets)
      end
    end
    local set, del = { "cu", fmt(cold), "sa", fmt(as_of), "sid", sid, "p", polar }, {}
    redis.call("HSET", st, "cu", fmt(cold), "sa", fmt(as_of), "sid", sid, "p", polar)
    for f, units in pairs(credits) do
      redis.call("HSET", st, f, units)
      set[#set + 1] = f
      set[#set + 1] = units
    end
    for f in pairs(old) do
      if string.sub(f, 1, 2) == "c:" and not credits[f] then
        redis.call("HDEL", st, f)
        del[#del + 1] = f
      elseif string.sub(f, 1, 2) == "a:" then
        local b = tonumber(string.sub(f, 3))
        if b < cold and not (old_cold and b < old_cold) then
          buckets[string.sub(f, 3)] = true -- cold from now on: counted again
        end
      end
    end
    rebuild(st, buckets, undelivered, set, del)
    local rev = next_rev(old["rev"])
    redis.call("HSET", st, "rev", fmt(rev))
    touch(st, acked)
    record(reply, publish, st, rev, known, set, del)
  end
end
return finish(ARGV[1], reply, publish)
