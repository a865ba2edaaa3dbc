-- lib.lua: helpers shared by every Outpost script. `scripts/gen_scripts.py` prepends to each
-- script the stretches of this file (between blank lines) it uses: every one that defines no
-- function, and each function the script or another one it keeps names. Each script Redis runs
-- is self-contained; the TypeScript SDK composes them the same way.
--
-- Aggregates are "count sum min max", min and max written "-" for an empty set. Numbers are
-- written in the shortest form that reads back exactly. Every write bumps the identity's `rev`,
-- and the change is published on the shard's channel by the same script, so other instances
-- can apply it in place when its revision is the next one they expect.

local TTL = 691200 -- eight days: an identity nobody writes for that long is forgotten

local format, floor = string.format, math.floor -- upvalues: cheaper than a field lookup each call

local function fmt(x)
  if x == floor(x) and x < 9007199254740992 and x > -9007199254740992 then
    return format("%d", x)
  end
  local s = format("%.15g", x)
  if tonumber(s) ~= x then
    s = format("%.16g", x)
    if tonumber(s) ~= x then
      s = format("%.17g", x)
    end
  end
  return s
end

-- The next revision of an identity's state. A hash that does not exist yet (new, expired or
-- wiped) starts from Redis's clock, in tenths of a millisecond since the epoch: its revisions are
-- then higher than any an earlier incarnation of it reached, so copies that followed that one
-- see a gap and reload instead of ignoring it. Fourteen digits: cjson and HSET write it exactly.
local fresh_rev = nil
local function next_rev(current)
  if current then
    return current + 1
  end
  if not fresh_rev then
    local t = redis.call("TIME")
    fresh_rev = tonumber(t[1]) * 10000 + math.floor(tonumber(t[2]) / 100)
  end
  return fresh_rev
end

local function agg_add(a, v)
  a.c = a.c + 1
  a.s = a.s + v
  if a.lo == nil or v < a.lo then a.lo = v end
  if a.hi == nil or v > a.hi then a.hi = v end
  return a
end

local function agg_encode(a)
  local lo, hi = "-", "-"
  if a.c > 0 then
    lo, hi = fmt(a.lo), fmt(a.hi)
  end
  return a.c .. " " .. fmt(a.s) .. " " .. lo .. " " .. hi
end

-- The aggregate `text` (nil: the empty one) with one more value `v`, without building a table:
-- track runs this on every event.
local function agg_with(text, v)
  if not text then
    local x = fmt(v)
    return "1 " .. x .. " " .. x .. " " .. x
  end
  local c, s, lo, hi = string.match(text, "^(%S+) (%S+) (%S+) (%S+)$")
  lo, hi = tonumber(lo), tonumber(hi)
  if lo == nil or v < lo then lo = v end
  if hi == nil or v > hi then hi = v end
  return (tonumber(c) + 1) .. " " .. fmt(tonumber(s) + v) .. " " .. fmt(lo) .. " " .. fmt(hi)
end

-- An events-hash field is "<bucket start>:<event id>"; its value is "<value>" while the event is
-- undelivered and "<value> <acknowledged at>" once Polar has acknowledged it.
local function field_bucket(field)
  return tonumber(string.match(field, "^(%d+):"))
end

local function event_value(text)
  local v, acked = string.match(text, "^(%S+) ?(%S*)$")
  return tonumber(v), tonumber(acked)
end

-- Rebuild the local aggregate of each bucket in `buckets` (a set of bucket starts) from the
-- events that remain, and the identity's counters, from one pass over the events hash. A caller
-- that already read the hash passes it (`flat`) with the fields it removed since (`removed`).
local function rebuild(st, ev, buckets, set, del, flat, removed)
  flat = flat or redis.call("HGETALL", ev)
  removed = removed or {}
  local aggs, n, u = {}, 0, 0
  for i = 1, #flat, 2 do
    if not removed[flat[i]] then -- a field the caller removed after reading the hash is gone
      n = n + 1
      local v, acked = event_value(flat[i + 1])
      if not acked then u = u + 1 end
      local b = field_bucket(flat[i])
      if buckets[b] then
        aggs[b] = agg_add(aggs[b] or { c = 0, s = 0 }, v)
      end
    end
  end
  for b in pairs(buckets) do
    local f = "a:" .. fmt(b)
    if aggs[b] then
      local text = agg_encode(aggs[b])
      redis.call("HSET", st, f, text)
      set[#set + 1] = f
      set[#set + 1] = text
    elseif redis.call("HDEL", st, f) == 1 then
      del[#del + 1] = f
    end
  end
  redis.call("HSET", st, "n", n, "u", u)
  set[#set + 1] = "n"
  set[#set + 1] = tostring(n)
  set[#set + 1] = "u"
  set[#set + 1] = tostring(u)
end

-- XACK and XDEL the outbox entries ARGV[first..last], in slices: unpack() of thousands of
-- arguments overflows Lua's stack.
local function settle_entries(stream, group, first, last)
  for from = first, last, 500 do
    local to = math.min(from + 499, last)
    redis.call("XACK", stream, group, unpack(ARGV, from, to))
    redis.call("XDEL", stream, unpack(ARGV, from, to))
  end
end

local function touch(st, ev)
  redis.call("EXPIRE", st, TTL)
  redis.call("EXPIRE", ev, TTL)
end

-- Record one identity's change: the delta goes to the channel; the caller gets the delta when
-- it already holds the previous revision (`known`), the whole state hash when it holds another,
-- and only the new revision when it does not follow this identity (`known` < 0).
local function record(reply, publish, st, rev, known, set, del)
  publish[#publish + 1] = { k = st, r = rev, s = set, d = del }
  if known < 0 then
    reply[#reply + 1] = { k = st, r = rev }
    reply.differs = true
    reply.blind = true
  elseif known == rev - 1 then
    reply[#reply + 1] = publish[#publish]
  else
    reply[#reply + 1] = { k = st, r = rev, s = redis.call("HGETALL", st), full = 1 }
    reply.differs = true
  end
end

-- Publish the deltas and return the reply; both are the same text in the common case (the
-- caller held every previous revision), so it is encoded once. When the reply differs (the
-- caller held older revisions: whole states) but still carries every change, it comes with the
-- published text, as [message, reply]: the caller then knows the echo it will get, unparsed. A
-- reply that carries only revisions (the caller did not follow an identity) comes alone: its
-- echo has content the caller lacks.
local function finish(channel, reply, publish)
  local message = nil
  if #publish > 0 then
    message = cjson.encode({ c = publish })
    redis.call("SPUBLISH", channel, message)
  end
  if message and not reply.differs then
    return message
  end
  local covered = message and not reply.blind
  reply.differs, reply.blind = nil, nil
  local text = cjson.encode({ c = reply })
  if covered then
    return { message, text }
  end
  return text
end

-- The identities of a settle script (acknowledge, confirm): KEYS[2i], KEYS[2i+1] are identity
-- i's state and events hashes; from ARGV[pos] come the revision the caller holds (-1: none), k,
-- and k events-hash fields. `change(st, ev, fields)` does the script's own work and returns the
-- state-hash fields it set and deleted, or nil when nothing changed; then the revision moves on,
-- the TTLs are refreshed and the change is recorded. Returns the reply and the deltas to publish.
local function settle_identities(pos, change)
  local reply, publish = {}, {}
  for i = 1, (#KEYS - 1) / 2 do
    local st, ev = KEYS[2 * i], KEYS[2 * i + 1]
    local known, k = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
    local fields = {}
    for j = pos + 2, pos + 1 + k do
      fields[#fields + 1] = ARGV[j]
    end
    pos = pos + 2 + k
    local set, del = change(st, ev, fields)
    if set then
      local rev = next_rev(tonumber(redis.call("HGET", st, "rev")))
      redis.call("HSET", st, "rev", fmt(rev))
      touch(st, ev)
      record(reply, publish, st, rev, known, set, del)
    end
  end
  return reply, publish
end
