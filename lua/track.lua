-- track.lua: reduce one event into each identity it counts in, and queue it for delivery.
--
-- KEYS[1]            the shard's outbox stream
-- KEYS[2i], KEYS[2i+1]  state hash and events hash of identity i (i = 1..n), same shard
-- ARGV[1]  the shard's channel
-- ARGV[2]  events-hash field "<bucket start>:<event id>"
-- ARGV[3]  bucket start (µs)
-- ARGV[4]  outbox field "e": the event as an item of Polar's ingestion body (JSON)
-- ARGV[5]  outbox field "k": the state keys of the identities (JSON list)
-- ARGV[4+2i], ARGV[5+2i]  for identity i: the revision the caller holds (-1: none), the value
--
-- Reply: JSON {"c": [change, ...]} (see lib.lua `record`), or {"dup": 1} when the event id is
-- already pending in the first identity (a retried track): nothing is written then.
-- The event counts whole in its bucket's local aggregate, hot or cold: it stays there, and in
-- the events hash, until a snapshot counts it or it is confirmed dropped.

local field, bucket = ARGV[2], ARGV[3]
local n = (#KEYS - 1) / 2
if n > 0 and redis.call("HEXISTS", KEYS[3], field) == 1 then
  return '{"dup":1}'
end
local reply, publish = {}, {}
for i = 1, n do
  local st, ev = KEYS[2 * i], KEYS[2 * i + 1]
  local known, raw = tonumber(ARGV[4 + 2 * i]), ARGV[5 + 2 * i]
  local f = "a:" .. bucket
  local text = agg_encode(agg_add(agg_decode(redis.call("HGET", st, f)), tonumber(raw)))
  local rev = redis.call("HINCRBY", st, "rev", 1)
  local pending = redis.call("HINCRBY", st, "n", 1)
  local undelivered = redis.call("HINCRBY", st, "u", 1)
  redis.call("HSET", st, f, text)
  redis.call("HSET", ev, field, raw)
  touch(st, ev)
  record(reply, publish, st, rev, known,
    { f, text, "n", tostring(pending), "u", tostring(undelivered) }, {})
end
redis.call("XADD", KEYS[1], "*", "e", ARGV[4], "f", field, "k", ARGV[5])
return finish(ARGV[1], reply, publish)
