-- lease: a replica's lease on one key: return what is left of its old lease, take a new one,
-- in one call (src/limiter/redis/lease.rs), mirroring src/limiter/lease.rs. Its own script:
-- the prelude and the algorithm files, then this. A key's state is read and written only
-- through its algorithm's `load`, `admits`, `take`, `name_take`, `give_named`, `text` and
-- `fresh_at` (and the bucket's `next_step`), so this file holds no state format of its own.
--
-- KEYS[1]   the state key
-- KEYS[2]   its leases (KEYS[1] .. ":lease", in the same slot): a hash, field a replica's id,
--           value "units:expires:returnable:mark:state" (microseconds, exclusive: the units may
--           be spent before expires, given back before returnable: a funnel's expiry, a
--           window's end, a bucket's next refill step; mark: the algorithm's `name_take` of the grant, which its return by
--           name needs; state: the key's text as the grant left it); its TTL reaches the latest
--           returnable. A reset deletes it
--           with the state, so that no return made after the reset gives anything back.
-- ARGV[1]   "now" override in microseconds, or "" to read Redis TIME
-- ARGV[2]   "1"; ARGV[3..9] the limit's seven fields (prelude.lua's contract: a fixed
--           window's calendar window included)
-- ARGV[10]  the replica's id
-- ARGV[11]  units of the replica's current lease on the key to give back (its record says
--           which lease that is, and until when it may come back)
-- ARGV[12]  units wanted (0: return only)
-- ARGV[13]  the most the new lease may be valid, in microseconds
-- ARGV[14]  optional: a deadline (Unix microseconds) after which the call does nothing at all
--           (a region's call to the home Redis that arrives after its caller gave up on it,
--           e.g. held in a partition: it must neither return units of a newer lease under the
--           same id nor take a share no one will spend)
--
-- The rules (src/limiter/lease.rs): a lease expires at min(now + validity, horizon), the
-- horizon being where the algorithm's count starts over (a window's end, calendar windows
-- included; a token bucket's next refill step, one period after now for a full bucket; none
-- for a funnel);
-- it holds at most a quarter of what remains (at least 1);
-- its units are taken as spent at its last moment, last = expires - 1 (a token bucket's at
-- now, in the refill step that holds the whole lease), as a named take (so
-- that no anonymous refund gives them back), and granted only while the state then admits
-- nothing beyond its bound at now. A return gives the units back by name at now:
-- a window's to the window they were counted in while it lasts, a bucket's to the refill step
-- (even after the lease expired: they were never spent); a funnel's only before the expiry and while its state is as the
-- grant left it (the lease's slots are then the last ones, all still ahead of now).
--
-- Reply: { now, returned, units, expires, remaining, reset }: Redis's now; the units given
-- back; the new lease's units (0: none) and expiry; what the key holds after the call and its
-- reset (microseconds), with every leased unit counted.

floor, format = math.floor, string.format

local now = clock(ARGV[1])
if ARGV[14] ~= nil and ARGV[14] ~= "" and now > clamp(ARGV[14]) then
  return { now, 0, 0, 0, 0, 0 }
end

local code = ARGV[3]
if type(MAKERS[code]) ~= "function" then
  return redis.error_reply("sluice: no leases for algorithm code " .. tostring(code))
end
local algo = MAKERS[code]()
if not algo.text or (code ~= "f" and code ~= "b" and code ~= "w" and code ~= "s") then
  return redis.error_reply("sluice: no leases for algorithm code " .. code)
end
local p = algo.params(clamp(ARGV[4]), clamp(ARGV[5]), clamp(ARGV[6]), false)
-- A calendar window (fixed windows only), as main.lua reads it: the one of the three that
-- holds Redis's now.
if ARGV[9] ~= nil and ARGV[9] ~= "" then
  local a, b, c, d = string.match(ARGV[9], "^(%d+),(%d+),(%d+),(%d+)$")
  if a == nil or code ~= "w" then
    return redis.error_reply("sluice: malformed calendar window of a lease")
  end
  p.cal_previous, p.cal_start, p.cal_end, p.cal_next = tonumber(a), tonumber(b), tonumber(c),
    tonumber(d)
end
local key, records, id = KEYS[1], KEYS[2], ARGV[10]
local give, want, validity = clamp(ARGV[11]), clamp(ARGV[12]), clamp(ARGV[13])

local text = redis.call("GET", key)
local state = algo.load(text)
local changed = false

-- The old lease: its unused units back while it is valid; its record goes either way.
local returned = 0
local record = redis.call("HGET", records, id)
if record then
  local units, returnable, mark, left = string.match(record, "^(%d+):%d+:(%d+):(%d+):(.*)$")
  units, returnable, mark = tonumber(units) or 0, tonumber(returnable) or 0, tonumber(mark) or 0
  local tail = code ~= "f" or left == (text or "")
  if give > 0 and now < returnable and tail then
    returned = math.min(give, units)
    state = algo.give_named(p, state, now, returned, mark)
    changed = true
  end
  redis.call("HDEL", records, id)
end

-- The new lease: where the count of `s` at `at` starts over (Algo's horizon in lease.rs).
local function horizon(s, at)
  if code == "f" then return MAX end
  if code == "b" then return algo.next_step(p, s, at) end
  if code == "w" then return sat_add(at, algo.reset(p, s, at)) end
  return sat_add(div_floor(at, p.period) * p.period, p.period)
end

-- Units are counted at the lease's last moment, a token bucket's at now (counted_at in
-- lease.rs: the same refill step, whose start a full bucket's take sets).
local function try(units, last)
  local at = last
  if code == "b" then at = now end
  if not algo.admits(p, state, at, units) then return nil end
  local taken = algo.take(p, state, at, units)
  if not algo.admits(p, taken, now, 0) then return nil end
  return algo.name_take(p, taken, at)
end

local granted, expires, returnable, granted_mark = 0, 0, 0, 0
-- At most a quarter of what remains (at least 1).
local share = floor(algo.remaining(p, state, now) / 4)
if share < 1 then share = 1 end
if want > share then want = share end
if want > 0 then
  expires = math.min(sat_add(now, validity), horizon(state, now))
  if expires > now then
    local last = expires - 1
    local taken, mark = try(1, last)
    if taken then
      local low, high = 1, want
      while low < high do
        local mid = low + floor((high - low + 1) / 2)
        local t, m = try(mid, last)
        if t then
          low, taken, mark = mid, t, m
        else
          high = mid - 1
        end
      end
      granted, state, changed, granted_mark = low, taken, true, mark
      -- Its units may come back until the count they were taken in starts over, as the take
      -- left it; a funnel's until its expiry.
      returnable = expires
      if code ~= "f" then returnable = horizon(state, last) end
    end
  end
end

local written = text or ""
if changed then
  local fresh_at = algo.fresh_at(p, state, now)
  if fresh_at then
    written = algo.text(p, state)
    redis.call("SET", key, written, "PX", format("%d", ttl_ms(now, fresh_at)))
  else
    written = ""
    if text then redis.call("DEL", key) end
  end
end
if granted > 0 then
  redis.call("HSET", records, id,
             fmt(granted) .. ":" .. fmt(expires) .. ":" .. fmt(returnable) .. ":" ..
             fmt(granted_mark) .. ":" .. written)
  local ttl = ttl_ms(now, returnable)
  if redis.call("PTTL", records) < ttl then
    redis.call("PEXPIRE", records, ttl)
  end
end

return { now, returned, granted, expires, algo.remaining(p, state, now),
         algo.reset(p, state, now) }
