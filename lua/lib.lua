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
-- `current` is the hash's `rev` as text (false: none). A revision the readers do not take
-- (anything but decimal digits below 2^53 - 1: a peer's -5, 1.5, 0x10 or 1e20) starts afresh
-- too: counted on from, it stays one no reader takes (-4, 2.5, 1e+20), or goes back, and every
-- copy would keep the hash as it was.
local fresh_rev = nil
local function next_rev(current)
  current = current and string.match(current, "^%d+$") and tonumber(current)
  if current and current < 9007199254740991 then
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
-- add its value to what `buckets` says its bucket lost, for `rebuild`. Returns 1 when the event
-- was undelivered (not acknowledged), else 0 (also when it was not pending: nothing to remove).
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
  local lost = buckets[b]
  if lost == nil then
    lost = { c = 0, s = 0 }
    buckets[b] = lost
  end
  if lost ~= true then
    local v = event_value(text)
    if v then agg_add(lost, v) else buckets[b] = true end -- unreadable: recount the bucket
  end
  if string.find(text, " ", 1, true) then
    return 0
  end
  return 1
end

-- The aggregate of bucket hash `ev` counted again from its events (nil: it holds none).
local function recount(ev)
  local flat = redis.call("HGETALL", ev)
  if #flat == 0 then
    return nil
  end
  local a = { c = 0, s = 0 }
  for i = 2, #flat, 2 do
    agg_add(a, (event_value(flat[i])))
  end
  return a
end

-- The aggregate `old` (text) without the events `lost` (a table of count, sum, min, max), when
-- that needs no recount: min and max stay when no lost value reached them (or the bucket's
-- values are all equal), and the sum is exact when every figure is an integer below 2^53.
-- nil: recount the bucket.
local EXACT = 9007199254740992
local function agg_without(old, lost)
  local c, s, lo, hi = string.match(old, "^(%S+) (%S+) (%S+) (%S+)$")
  c, s, lo, hi = tonumber(c), tonumber(s), tonumber(lo), tonumber(hi)
  if not (c and s and lo and hi) or lost.c >= c then
    return nil
  end
  local flat = lo == hi
  if not flat and (lost.lo <= lo or lost.hi >= hi) then
    return nil
  end
  if s ~= floor(s) or lost.s ~= floor(lost.s) or s >= EXACT or s <= -EXACT
      or lost.s >= EXACT or lost.s <= -EXACT then
    return nil
  end
  return { c = c - lost.c, s = s - lost.s, lo = lo, hi = hi }
end

-- Bring the local aggregate of each bucket in `buckets` up to date (bucket start, as text -> what
-- it lost, or true: count it again from its events hash), move `n` by how many events those
-- buckets hold less and `u` down by `undelivered` (the caller removed that many undelivered
-- events), and add the fields set and deleted to `set` and `del`. A bucket is read whole only when
-- it must be: it lost its min or max, or its sum is not an exact integer, or it is made cold;
-- else its aggregate moves by what it lost (a bucket of 300,000 events costs no more to drop one).
local function rebuild(st, buckets, undelivered, set, del)
  local delta = 0
  for b, lost in pairs(buckets) do
    local f = "a:" .. b
    local old = redis.call("HGET", st, f)
    local ev = bucket_key(st, b)
    local a = nil
    if old then
      delta = delta - tonumber(string.match(old, "^(%S+) "))
      if lost ~= true then
        a = agg_without(old, lost)
      end
    end
    if a == nil then
      a = recount(ev)
    end
    if a then
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
      local rev = next_rev(redis.call("HGET", st, "rev"))
      redis.call("HSET", st, "rev", fmt(rev))
      touch(st, acked)
      record(reply, publish, st, rev, known, set, del)
    end
  end
  return reply, publish
end

-- Admission (reserve, release, admit). A hold is a state-hash field "h:<hold id>" whose value is
-- "<units> <expires at, µs>": it counts against every meter of the identity while its expiry is
-- after `now` (the caller's clock, as for events), and is pruned by the next script that writes
-- the hash after that. `names` are the state hashes of one customer's names for one reducer, its
-- own first: Polar's totals and credits come from the newest snapshot among them (as reads merge
-- them), the pending events and holds of all of them count. Returns the consumed quantity of
-- aggregation `func` ("count" or "sum"), the units held, the expired hold fields of the first
-- hash, and the fields of the hash whose snapshot is newest (its "c:" credits).
local function agg_quantity(text, func)
  if not text then
    return 0
  end
  local c, s = string.match(text, "^(%S+) (%S+) ")
  return tonumber(func == "count" and c or s) or 0
end
local function admission_view(names, func, now)
  local consumed, held, expired, newest, best = 0, 0, {}, nil, nil
  for i, st in ipairs(names) do
    local flat = redis.call("HGETALL", st)
    local other = {}
    for j = 1, #flat, 2 do
      local name, text = flat[j], flat[j + 1]
      local kind = string.sub(name, 1, 2)
      if kind == "a:" then
        consumed = consumed + agg_quantity(text, func)
      elseif kind == "h:" then
        local units, at = string.match(text, "^(%S+) (%S+)$")
        units, at = tonumber(units), tonumber(at)
        if units and at and at > now then
          held = held + units
        elseif i == 1 then
          expired[#expired + 1] = name
        end
      else
        other[name] = text
      end
    end
    local age = { tonumber(other.cu) or 0, tonumber(other.sa) or 0 }
    if i == 1 or (other.cu and (age[1] > best[1] or (age[1] == best[1] and age[2] > best[2]))) then
      newest, best = other, age
    end
  end
  return consumed + agg_quantity(newest.p, func), held, expired, newest
end
local function prune_holds(st, fields, del)
  for _, f in ipairs(fields) do
    redis.call("HDEL", st, f)
    del[#del + 1] = f
  end
  return del
end
local function refusal(credit, balance, held)
  return cjson.encode({ no = { string.sub(credit, 3), fmt(balance), fmt(held) } })
end
