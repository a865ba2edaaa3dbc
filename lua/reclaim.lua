-- reclaim.lua: take over the outbox entries of consumers whose heartbeat expired (their instance
-- died or closed), and remove each of them from the group once it holds nothing. Checking and
-- removing in one script matters: removing a consumer drops the entries it holds, so a consumer
-- is only removed while it holds none.
--
-- KEYS[1]   the shard's outbox stream
-- ARGV[1]   consumer group
-- ARGV[2]   the consumer taking the entries; "" takes none (a closing instance removing itself)
-- ARGV[3]   most entries to take from each consumer
-- ARGV[4..] the consumers whose heartbeat expired
--
-- Reply: JSON {"e": [[entry id, [field, value, ...]], ...], "d": [removed consumer, ...]}.
-- Entries are taken whatever their idle time; taking them again changes nothing.

local stream, group, taker, most = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local taken, removed = {}, {}
for i = 4, #ARGV do
  local name = ARGV[i]
  if taker ~= "" and most > 0 then
    local held = redis.call("XPENDING", stream, group, "-", "+", most, name)
    -- XCLAIM in slices: unpack() of thousands of arguments overflows Lua's stack.
    for from = 1, #held, 500 do
      local ids = {}
      for j = from, math.min(from + 499, #held) do
        ids[#ids + 1] = held[j][1]
      end
      for _, e in ipairs(redis.call("XCLAIM", stream, group, taker, 0, unpack(ids))) do
        if type(e) == "table" then -- an entry deleted meanwhile comes back as nil
          taken[#taken + 1] = e
        end
      end
    end
  end
  if #redis.call("XPENDING", stream, group, "-", "+", 1, name) == 0 then
    redis.call("XGROUP", "DELCONSUMER", stream, group, name)
    removed[#removed + 1] = name
  end
end
return cjson.encode({ e = taken, d = removed })
