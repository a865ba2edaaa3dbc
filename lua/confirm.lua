-- confirm.lua: these events were dropped; Polar will never count them. They stop being pending
-- everywhere, hot bucket or cold, and leave their buckets' local aggregates at once.
--
-- KEYS and ARGV as acknowledge.lua (ARGV[3] is unused but kept so both take one shape).
-- Reply: JSON {"c": [change, ...]}. Confirming twice changes nothing the second time.

local m = tonumber(ARGV[4])
local reply, publish = settle_identities(5 + m, function(st, ev, fields)
  local buckets, any = {}, false
  for _, field in ipairs(fields) do
    if redis.call("HDEL", ev, field) == 1 then
      buckets[field_bucket(field)] = true
      any = true
    end
  end
  if not any then
    return nil
  end
  local set, del = {}, {}
  rebuild(st, ev, buckets, set, del)
  return set, del
end)
settle_entries(KEYS[1], ARGV[2], 5, 4 + m)
return finish(ARGV[1], reply, publish)
