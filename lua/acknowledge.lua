-- acknowledge.lua: Polar stored these events. They stay pending (counted locally) until a
-- snapshot counts them, so a snapshot computed before the acknowledgement and applied after it
-- still finds them. The acknowledgement time is recorded, in the event's value and as its score in
-- the acknowledged set: a snapshot that makes the event's bucket cold and still does not count it
-- drops it once an hour has passed since that time.
--
-- KEYS[1]                the shard's outbox stream
-- KEYS[2i], KEYS[2i+1]   state hash and acknowledged set of identity i (the events' bucket
--                        hashes are derived from the state key: lib.lua)
-- ARGV[1]  the shard's channel
-- ARGV[2]  consumer group
-- ARGV[3]  now (µs)
-- ARGV[4]  m, the number of outbox entry ids; ARGV[5..4+m] the ids (acknowledged and deleted)
-- then for each identity: the revision the caller holds (-1: none), k, and k events fields
--
-- Reply: JSON {"c": [change, ...]}. Acknowledging twice changes nothing the second time.

local now = ARGV[3]
local m = tonumber(ARGV[4])
local CHUNK = 1000 -- fields per command: unpack's stack has a limit
local reply, publish = settle_identities(5 + m, function(st, acked, fields)
  -- One read, one write and one ZADD per bucket and chunk, not per event: the calls into Redis
  -- cost more than the work they do.
  local buckets, order, seen = {}, {}, {}
  for _, field in ipairs(fields) do
    local b = not seen[field] and field_bucket(field)
    if b then
      seen[field] = true
      local ev = bucket_key(st, b)
      local list = buckets[ev]
      if not list then
        list = {}
        buckets[ev] = list
        order[#order + 1] = ev
      end
      list[#list + 1] = field
    end
  end
  local done = 0
  for _, ev in ipairs(order) do
    local list = buckets[ev]
    local written = false
    for from = 1, #list, CHUNK do
      local part = { unpack(list, from, math.min(from + CHUNK - 1, #list)) }
      local texts = redis.call("HMGET", ev, unpack(part))
      local pairs_, scores = {}, {}
      for i, field in ipairs(part) do
        local text = texts[i]
        if text and not string.find(text, " ", 1, true) then
          pairs_[#pairs_ + 1] = field
          pairs_[#pairs_ + 1] = text .. " " .. now
          scores[#scores + 1] = now
          scores[#scores + 1] = field
        end
      end
      if #pairs_ > 0 then
        redis.call("HSET", ev, unpack(pairs_))
        redis.call("ZADD", acked, unpack(scores))
        done = done + #pairs_ / 2
        written = true
      end
    end
    if written then
      redis.call("EXPIRE", ev, TTL)
    end
  end
  if done == 0 then
    return nil
  end
  return { "u", tostring(redis.call("HINCRBY", st, "u", -done)) }, {}
end)
settle_entries(KEYS[1], ARGV[2], 5, 4 + m)
return finish(ARGV[1], reply, publish)
