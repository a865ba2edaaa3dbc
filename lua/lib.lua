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

-- The layout of an identity's pending events (version 2). Each bucket's events live in a hash of
-- their own, `<state key>:ev:<bucket start>`, so a script reads only the buckets it works on. A
-- field is "<bucket start>:<event id>"; its value is "<value>" while the event is undelivered and
-- "<value> <acknowledged at>" once Polar has acknowledged it. The sorted set `<state key>:acked`
-- indexes the acknowledged events still pending (member: the field, score: acknowledged at), so
-- a snapshot finds those whose keep time ran out without reading any events hash.
--
-- A bucket's events hash is non-empty only while the state hash has its `a:<bucket>` field: the
-- state hash is the index of the identity's buckets. Every script keeps it so (track writes both;
-- `rebuild` deletes `a:` only for a bucket whose hash is empty). `n` is the sum of the `a:`
-- counts, moved by what each script adds or removes (HINCRBY), never recounted by a full pass.
--
-- Keys: a script declares, per identity, the state hash and one more key it knows: track the
-- event's bucket hash, every other script the acknowledged set. The other bucket hashes a script
-- touches it derives from the state key (`bucket_key`): they share the state key's hash tag, so
-- they are in its slot, which Redis Cluster accepts from a script without a shebang
-- (tests/cluster/test_cluster_facts.py checks it on a real cluster). The caller could not declare
-- them: which buckets a snapshot makes cold, and where the expired acknowledged events are, is
-- known only inside the script.
--
-- TTL: every key a script writes gets eight days again (state hash, the bucket hashes it writes or
-- rebuilds, the acknowledged set). A bucket hash no script writes for eight days expires on its
-- own while the state hash lives on (an outage that holds its events undelivered that long): its
-- `a:` field and `n` then still count the events it held, until a snapshot makes the bucket cold
-- or a script rebuilds it. That only over-counts local consumption, so the balance stays
-- conservative (lower than Polar's), never generous. `u`, a status figure outside the balance,
-- keeps counting the undelivered events such a hash held (nothing tells how many there were).
local function bucket_key(st, bucket)
  return st .. ":ev:" .. bucket
end

-- The bucket start of an events field, as the text it is written in (nil: not a field).
local function field_bucket(field)
  return string.match(field, "^(%d+):")
end

local function event_value(text)
  local v, acked = string.match(text, "^(%S+) ?(%S*)$")
  return tonumber(v), tonumber(acked)
end

-- Remove one pending event (its field) from its bucket's hash and from the acknowledged set, and
-- mark its bucket in `buckets` for `rebuild`. Returns 1 when the event was undelivered (not
-- acknowledged), else 0 (also when it was not pending: nothing to remove).
local function remove_event(st, acked, field, buckets)
  local b = field_bucket(field)
  redis.call("ZREM", acked, field)
  if not b then
    return 0
  end
  local ev = bucket_key(st, b)
  local text = redis.call("HGET", ev, field)
  if not text then
    return 0
  end
  redis.call("HDEL", ev, field)
  buckets[b] = true
  if string.find(text, " ", 1, true) then
    return 0
  end
  return 1
end

-- Rebuild the local aggregate of each bucket in `buckets` (a set of bucket starts, as text) from
-- its events hash alone, move `n` by how many events those buckets hold less (their old `a:`
-- counts against what remains) and `u` down by `undelivered` (the caller removed that many
-- undelivered events), and add the fields set and deleted to `set` and `del`.
local function rebuild(st, buckets, undelivered, set, del)
  local delta = 0
  for b in pairs(buckets) do
    local f = "a:" .. b
    local old = redis.call("HGET", st, f)
    if old then
      delta = delta - tonumber(string.match(old, "^(%S+) "))
    end
    local ev = bucket_key(st, b)
    local flat = redis.call("HGETALL", ev)
    if #flat > 0 then
      local a = { c = 0, s = 0 }
      for i = 2, #flat, 2 do
        agg_add(a, (event_value(flat[i])))
      end
      delta = delta + a.c
      local text = agg_encode(a)
      redis.call("HSET", st, f, text)
      redis.call("EXPIRE", ev, TTL)
      set[#set + 1] = f
      set[#set + 1] = text
    elseif old then
      redis.call("HDEL", st, f)
      del[#del + 1] = f
    end
  end
  set[#set + 1] = "n"
  set[#set + 1] = tostring(redis.call("HINCRBY", st, "n", delta))
  set[#set + 1] = "u"
  -- 0 - x, not -x: -0 would be written "-0", which HINCRBY refuses
  set[#set + 1] = tostring(redis.call("HINCRBY", st, "u", 0 - undelivered))
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

local function touch(st, other)
  redis.call("EXPIRE", st, TTL)
  redis.call("EXPIRE", other, TTL)
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
-- i's state hash and acknowledged set; from ARGV[pos] come the revision the caller holds (-1:
-- none), k, and k events fields. `change(st, acked, fields)` does the script's own work and
-- returns the state-hash fields it set and deleted, or nil when nothing changed; then the
-- revision moves on, the TTLs are refreshed and the change is recorded. Returns the reply and the
-- deltas to publish.
local function settle_identities(pos, change)
  local reply, publish = {}, {}
  for i = 1, (#KEYS - 1) / 2 do
    local st, acked = KEYS[2 * i], KEYS[2 * i + 1]
    local known, k = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
    local fields = {}
    for j = pos + 2, pos + 1 + k do
      fields[#fields + 1] = ARGV[j]
    end
    pos = pos + 2 + k
    local set, del = change(st, acked, fields)
    if set then
      local rev = next_rev(tonumber(redis.call("HGET", st, "rev")))
      redis.call("HSET", st, "rev", fmt(rev))
      touch(st, acked)
      record(reply, publish, st, rev, known, set, del)
    end
  end
  return reply, publish
end
