-- track.lua: reduce one event into each identity it counts in, and queue it for delivery.
--
-- KEYS[1]            the shard's outbox stream
-- KEYS[2i], KEYS[2i+1]  state hash of identity i (i = 1..n), same shard, and its events hash of
--                       the event's bucket (`<state key>:ev:<bucket start>`)
-- ARGV[1]  the shard's channel
-- ARGV[2]  events field "<bucket start>:<event id>"
-- ARGV[3]  bucket start (µs)
-- ARGV[4]  outbox field "e": the event as an item of Polar's ingestion body (JSON)
-- ARGV[5]  outbox field "k": the state keys of the identities (JSON list)
-- ARGV[4+2i], ARGV[5+2i]  for identity i: the revision the caller holds (-1: none), the value
--
-- Reply: JSON {"c": [change, ...]} (see lib.lua `record`), or {"dup": 1} when every identity
-- already holds this events field (a retried track): nothing is written then. An identity that
-- already holds it is left alone, so a retry after the configuration changed writes only the
-- identities that are new to the event.
-- The event counts whole in its bucket's local aggregate, hot or cold: it stays there, and in
-- its bucket's events hash, until a snapshot counts it or it is confirmed dropped.

local field, bucket = ARGV[2], ARGV[3]
local n = (#KEYS - 1) / 2
local reply, publish = {}, {}
local written = 0
for i = 1, n do
  local st, ev = KEYS[2 * i], KEYS[2 * i + 1]
  local known, raw = tonumber(ARGV[4 + 2 * i]), ARGV[5 + 2 * i]
  if redis.call("HSETNX", ev, field, raw) == 1 then
    written = written + 1
    local f = "a:" .. bucket
    local old = redis.call("HMGET", st, "rev", "n", "u", f)
    local rev = next_rev(old[1])
    -- counters as strings: redis.call would format a number argument itself, at a cost
    local pending = fmt((tonumber(old[2]) or 0) + 1)
    local undelivered = fmt((tonumber(old[3]) or 0) + 1)
    local text = agg_with(old[4], tonumber(raw))
    redis.call("HSET", st, "rev", fmt(rev), "n", pending, "u", undelivered, f, text)
    if not old[4] then
      touch(st, ev) -- once per identity and bucket: every other script refreshes the TTL too
    end
    record(reply, publish, st, rev, known, { f, text, "n", pending, "u", undelivered }, {})
  end
end
if n > 0 and written == 0 then
  return '{"dup":1}'
end
redis.call("XADD", KEYS[1], "*", "e", ARGV[4], "f", field, "k", ARGV[5])
return finish(ARGV[1], reply, publish)
