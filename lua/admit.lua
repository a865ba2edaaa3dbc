-- admit.lua: track one event as track.lua does, on conditions, in one script. With checks, the
-- event is written only if every meter it counts in has the available balance (credited -
-- consumed - held, over every name of the customer) to cover its value (1 for a count); else
-- nothing is written. With a hold, the hold is released by the same script (a reservation's
-- commit: the event is recorded whatever it holds, and even when the hold expired).
--
-- KEYS[1]               the shard's outbox stream
-- KEYS[2i], KEYS[2i+1]  state hash and events hash (of the event's bucket) of identity i, i = 1..n
-- KEYS[2n+2..]          further state hashes: the customer's other names' (for the checks), and
--                       the hold's when it is none of the identities'
-- ARGV[1..5]  as track.lua (channel, events field, bucket start, outbox item, state keys)
-- ARGV[6]   now (µs)
-- ARGV[7]   n, the number of identities
-- ARGV[8]   the hold's field ("" : none), ARGV[9] the index in KEYS of its state hash, ARGV[10]
--           the revision of that hash the caller holds (-1: none)
-- then for each identity i: the revision the caller holds (-1: none), the value, the check
-- ("count", "sum", or "" for none), m and m credits fields "c:<meter id>", a and the a indexes in
-- KEYS of the state hashes of the customer's other names for the identity's reducer
--
-- Reply: JSON {"c": [change, ...]}; {"no": [meter id, balance, held]} when a check fails
-- (nothing written); {"dup": 1} when every identity already holds the event (a retry).

local field, bucket, now = ARGV[2], ARGV[3], tonumber(ARGV[6])
local n = tonumber(ARGV[7])
local hold, hold_known = ARGV[8], tonumber(ARGV[10])
local hold_st = hold ~= "" and KEYS[tonumber(ARGV[9])] or nil
local ids, pos = {}, 11
for i = 1, n do
  local id = { st = KEYS[2 * i], ev = KEYS[2 * i + 1], known = tonumber(ARGV[pos]) }
  id.raw, id.check = ARGV[pos + 1], ARGV[pos + 2]
  local m = tonumber(ARGV[pos + 3])
  id.credits = { unpack(ARGV, pos + 4, pos + 3 + m) }
  pos = pos + 4 + m
  local a = tonumber(ARGV[pos])
  id.names = { id.st }
  for j = pos + 1, pos + a do
    id.names[#id.names + 1] = KEYS[tonumber(ARGV[j])]
  end
  pos = pos + 1 + a
  id.expired = {}
  ids[i] = id
end
-- A retried admission must not be refused for the balance its first run took: with checks, a
-- retry is recognised before them (without, the writes below recognise it, as track.lua does).
local checked = false
for _, id in ipairs(ids) do
  checked = checked or id.check ~= ""
end
local fresh = 0
for _, id in ipairs(checked and ids or {}) do
  fresh = fresh + 1 - redis.call("HEXISTS", id.ev, field)
end
if checked and fresh == 0 then
  return '{"dup":1}'
end
for _, id in ipairs(ids) do
  if id.check ~= "" then
    local consumed, held, expired, newest = admission_view(id.names, id.check, now)
    local cover = id.check == "count" and 1 or tonumber(id.raw)
    for _, credit in ipairs(id.credits) do
      local balance = (tonumber(newest[credit]) or 0) - consumed
      if balance - held < cover then
        return refusal(credit, balance, held)
      end
    end
    id.expired = expired
  end
end
local reply, publish = {}, {}
local released, written = false, 0
for _, id in ipairs(ids) do
  local st, ev, raw = id.st, id.ev, id.raw
  if redis.call("HSETNX", ev, field, raw) == 1 then
    written = written + 1
    local f = "a:" .. bucket
    local old = redis.call("HMGET", st, "rev", "n", "u", f)
    local rev = next_rev(old[1])
    local pending = fmt((tonumber(old[2]) or 0) + 1)
    local undelivered = fmt((tonumber(old[3]) or 0) + 1)
    local text = agg_with(old[4], tonumber(raw))
    redis.call("HSET", st, "rev", fmt(rev), "n", pending, "u", undelivered, f, text)
    if not old[4] then
      touch(st, ev)
    end
    local del = prune_holds(st, id.expired, {})
    if st == hold_st then
      released = true
      if redis.call("HDEL", st, hold) == 1 then
        del[#del + 1] = hold
      end
    end
    record(reply, publish, st, rev, id.known, { f, text, "n", pending, "u", undelivered }, del)
  end
end
if n > 0 and written == 0 then
  return '{"dup":1}'
end
if hold_st and not released and redis.call("HDEL", hold_st, hold) == 1 then
  local rev = next_rev(redis.call("HGET", hold_st, "rev"))
  redis.call("HSET", hold_st, "rev", fmt(rev))
  record(reply, publish, hold_st, rev, hold_known, {}, { hold })
end
redis.call("XADD", KEYS[1], "*", "e", ARGV[4], "f", field, "k", ARGV[5])
return finish(ARGV[1], reply, publish)
