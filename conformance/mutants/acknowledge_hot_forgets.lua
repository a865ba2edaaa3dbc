-- MUTANT of acknowledge.lua (tests/conformance/test_mutant.py): the naive write-path
-- rule, "a hot bucket, at or after cold_until, counts its events whole, so an
-- acknowledged event just stops being pending". In a hot bucket (bucket >= cu, or no cu yet)
-- acknowledging removes the event from its bucket's events hash and leaves the bucket's aggregate
-- as it is; in a cold bucket the event stays pending, marked acknowledged, as acknowledge.lua does.
--
-- It is wrong (docs/invariant.md, "The tricky interleaving"): a snapshot computed before the acknowledgement, applied after
-- it, makes the bucket cold without counting the event, and rebuilds the bucket from the events
-- that remain, so the event stops counting anywhere until a later snapshot counts it. Composed
-- with lib.lua like every script; KEYS, ARGV and reply as acknowledge.lua.

local now = ARGV[3]
local m = tonumber(ARGV[4])
local pos = 5 + m
local reply, publish = {}, {}
for i = 1, (#KEYS - 1) / 2 do
  local st, acked = KEYS[2 * i], KEYS[2 * i + 1]
  local known, k = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  local cold = tonumber(redis.call("HGET", st, "cu"))
  local done, forgotten = 0, 0
  for j = pos + 2, pos + 1 + k do
    local b = field_bucket(ARGV[j])
    local ev = bucket_key(st, b)
    local text = redis.call("HGET", ev, ARGV[j])
    if text and not string.find(text, " ", 1, true) then
      if cold == nil or tonumber(b) >= cold then
        redis.call("HDEL", ev, ARGV[j])
        forgotten = forgotten + 1
      else
        redis.call("HSET", ev, ARGV[j], text .. " " .. now)
        redis.call("ZADD", acked, now, ARGV[j])
      end
      done = done + 1
    end
  end
  pos = pos + 2 + k
  if done > 0 then
    local set = { "u", tostring(redis.call("HINCRBY", st, "u", -done)) }
    if forgotten > 0 then
      set[3] = "n"
      set[4] = tostring(redis.call("HINCRBY", st, "n", -forgotten))
    end
    local rev = redis.call("HINCRBY", st, "rev", 1)
    touch(st, acked)
    record(reply, publish, st, rev, known, set, {})
  end
end
if m > 0 then
  redis.call("XACK", KEYS[1], ARGV[2], unpack(ARGV, 5, 4 + m))
  redis.call("XDEL", KEYS[1], unpack(ARGV, 5, 4 + m))
end
return finish(ARGV[1], reply, publish)
