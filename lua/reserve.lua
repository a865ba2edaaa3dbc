-- reserve.lua: hold `units` of a meter for one customer, only when its available balance
-- (credited - consumed - held, over every name of the customer) covers them; else hold nothing.
--
-- KEYS[1]   the customer's state hash of the meter's reducer
-- KEYS[2..] the state hashes of the customer's other names for that reducer (Polar's aliases)
-- ARGV[1]  the shard's channel
-- ARGV[2]  now (µs)
-- ARGV[3]  the hold's field, "h:<hold id>"
-- ARGV[4]  units (> 0)
-- ARGV[5]  when the hold expires (µs)
-- ARGV[6]  the meter's aggregation: "count" or "sum"
-- ARGV[7]  the meter's credits field, "c:<meter id>"
-- ARGV[8]  the revision of KEYS[1] the caller holds (-1: none)
--
-- Reply: JSON {"c": [change]} (the hold, and the expired holds of KEYS[1] it pruned), or
-- {"no": [meter id, balance, held]} when the available balance does not cover `units` (nothing
-- written), or {"dup": 1} when KEYS[1] already holds this hold (a retried reserve).

local st, now = KEYS[1], tonumber(ARGV[2])
local field, units = ARGV[3], tonumber(ARGV[4])
if redis.call("HEXISTS", st, field) == 1 then
  return '{"dup":1}'
end
local consumed, held, expired, newest = admission_view(KEYS, ARGV[6], now)
local balance = (tonumber(newest[ARGV[7]]) or 0) - consumed
if balance - held < units then
  return refusal(ARGV[7], balance, held)
end
local text = ARGV[4] .. " " .. ARGV[5]
local del = prune_holds(st, expired, {})
local rev = next_rev(redis.call("HGET", st, "rev"))
redis.call("HSET", st, field, text, "rev", fmt(rev))
redis.call("EXPIRE", st, TTL)
local reply, publish = {}, {}
record(reply, publish, st, rev, tonumber(ARGV[8]), { field, text }, del)
return finish(ARGV[1], reply, publish)
