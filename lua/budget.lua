-- budget.lua: take one request from the budget for Polar's API that every instance of the
-- organization shares, a token bucket that callers may overdraw by one request each: a caller
-- that finds the bucket empty reserves the next request and is told when it comes, so callers
-- are served in the order they asked, with no retry storm and no starved instance.
--
-- KEYS[1]  the budget hash (`t`: tokens left, `at`: when it was last filled, µs)
-- ARGV[1]  requests a minute (the bucket fills at this rate; > 0)
-- ARGV[2]  capacity: most requests in a burst (>= 1)
-- ARGV[3]  now (µs); empty: Redis's clock, the one clock every instance shares
--
-- Reply: the µs the caller waits before sending the request it took (0: send it now).
-- A bucket that does not exist starts full; it expires once it would be full again anyway.

local rate, capacity = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local state = redis.call("HMGET", KEYS[1], "t", "at")
local tokens, at = tonumber(state[1]), tonumber(state[2])
if not tokens or not at then
  tokens, at = capacity, now
end
if now > at then -- a clock that went back fills nothing
  tokens = math.min(capacity, tokens + (now - at) * rate / 60000000)
  at = now
end
tokens = tokens - 1
local wait = 0
if tokens < 0 then
  wait = math.ceil(-tokens * 60000000 / rate)
end
redis.call("HSET", KEYS[1], "t", fmt(tokens), "at", fmt(at))
redis.call("PEXPIRE", KEYS[1], math.ceil((capacity - tokens) * 60000 / rate) + 1000)
return wait
