-- confirm.lua: these events were dropped; Polar will never count them. They stop being pending
-- everywhere, hot bucket or cold, and leave their buckets' local aggregates at once. Only the
-- buckets of these events are read again (rebuilt), whatever else the identity holds.
--
-- KEYS and ARGV as acknowledge.lua (ARGV[3] is unused but kept so both take one shape).
-- Reply: JSON {"c": [change, ...]}. Confirming twice changes nothing the second time.

local m = tonumber(ARGV[4])
local reply, publish = settle_identities(5 + m, function(st, acked, fields)
  local buckets, undelivered = {}, 0
  for _, field in ipairs(fields) do
    undelivered = undelivered + remove_event(st, acked, field, buckets)
  end
  if next(buckets) == nil then
    return nil
  end
  local set, del = {}, {}
  rebuild(st, buckets, undelivered, set, del)
  return set, del
end)
settle_entries(KEYS[1], ARGV[2], 5, 4 + m)
return finish(ARGV[1], reply, publish)
