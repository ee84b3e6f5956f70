-- share: a region's pool of a global limit's shares, in the region's own Redis (`redis.url`),
-- spent atomically for every replica of the region (src/limiter/redis/global.rs; the rules
-- are src/limiter/share.rs). Its own script: the prelude (for clock and fmt), the algorithm
-- files (unused), then this.
--
-- The home Redis (`redis.global_url`) lends the region shares by lease requests of the batch
-- script ("Leases" in prelude.lua), under two lessee ids (stable hashes of "<region>#0" and
-- "<region>#1"): the pool's two slots, so that the region can take the
-- next share while it spends the current one. A slot's units may be spent while now < its
-- `until` (the share's expiry, in this Redis's time and never later than home's). The home
-- Redis counts a share as spent at its expiry, so whatever happens here, no interval admits
-- more than the limit.
--
-- KEYS[1]  the pool, a hash (the state key .. ":share"):
--          l0 u0 n0 / l1 u1 n1  a slot's units left, its until, the units it was granted
--          low    renew when fewer units than this are left
--          lock   until when a replica is renewing (one at a time); tok its token
--          dry    home had nothing to lend: deny at once until then (the next try)
--          down   since when home is unreachable (0: it answers)
--          since seen rate   the region's demand: units asked since `since`; units a second
--          spent  units spent from shares; fb units admitted by global_on_error = share
--          fbw fbc  the fallback's window (now // period) and what it admitted in it
--          hr hreset  what home said was left at the last renewal, and its reset (our time)
-- ARGV[1]  "now" override in microseconds, or "" for Redis TIME
-- ARGV[2]  the operation:
--
-- "spend" cost, lock_ms, token, fallback, period, ttl_ms:
--   Spends `cost` from the slots (earliest until first) if they hold it; else, when
--   `fallback` > 0 and home is down, from the fallback window (`fallback` units a `period`
--   microseconds). Then, when fewer than `low` units are left (or none) and no renewal is
--   under way (and home is not dry), takes the lock with `token` for lock_ms and picks the
--   slot to renew: an ended one, else the one ending first; its units left come out of the
--   pool (the renewal gives them back to home by name).
--   Reply: { now, verdict (0 denied, 1 from a share, 2 from the fallback), left, slot + 1 (0: no
--   renewal for this caller), give, rate, waiting (1: a renewal is under way elsewhere, not
--   dry, not down), dry (microseconds to wait), down (1/0), hreset, took (the latest until
--   of the slots the cost came from, which "unspend" needs), short (1: home lent less than
--   asked last time: scarce, so a request the pool cannot pay is denied at once rather than
--   made to wait) }
-- "deposit" token, slot, units, until, home_remaining, home_reset, dry_until, ttl_ms, short:
--   The renewal's answer (only under the lock with `token`): the slot holds `units` until
--   `until`; `dry_until` > now: home had nothing, deny at once until then. Unlocks.
--   Reply: 1, or 0 when the lock was not this token's (the units are then lost).
-- "failed" token, retry_ms: home did not answer: down since now (unless already), the next
--   try after retry_ms. Reply: 1/0 as deposit.
-- "unspend" units, took: gives back units spent by a request that was then denied, to a
--   valid slot ending no later than `took` (so that no unit is spent after the expiry of the
--   share it came from), at most what that slot has spent. Reply: the units given back.
-- "peek": { now, l0, u0, n0, l1, u1, n1, spent, fb, down, hr, hreset, lock }

floor, format = math.floor, string.format

local now = clock(ARGV[1])
local pool = KEYS[1]
local op = ARGV[2]

local function num(field)
  return tonumber(redis.call("HGET", pool, field) or "0") or 0
end

local function keep(ttl_ms)
  if ttl_ms > 0 then redis.call("PEXPIRE", pool, ttl_ms) end
end

local slots = {}
local function load()
  for s = 0, 1 do
    slots[s] = { left = num("l" .. s), untl = num("u" .. s), units = num("n" .. s) }
  end
end

local function valid(s)
  return slots[s].untl > now and slots[s].left > 0
end

if op == "spend" then
  local cost, lock_ms, token = clamp(ARGV[3]), clamp(ARGV[4]), ARGV[5]
  local fallback, period, ttl = clamp(ARGV[6]), clamp(ARGV[7]), clamp(ARGV[8])
  load()
  local left = 0
  for s = 0, 1 do
    if valid(s) then left = left + slots[s].left end
  end
  local verdict, took = 0, 0
  if cost <= left then
    verdict = 1
    local need = cost
    local order = { 0, 1 }
    if slots[1].untl < slots[0].untl then order = { 1, 0 } end
    for _, s in ipairs(order) do
      if need > 0 and valid(s) then
        local t = math.min(need, slots[s].left)
        slots[s].left = slots[s].left - t
        need = need - t
        if t > 0 and slots[s].untl > took then took = slots[s].untl end
        redis.call("HSET", pool, "l" .. s, fmt(slots[s].left))
      end
    end
    left = left - cost
    if cost > 0 then redis.call("HINCRBY", pool, "spent", cost) end
  end
  if cost > 0 then redis.call("HSET", pool, "last", fmt(now)) end
  -- The region's demand (asked, admitted or not), units a second.
  local since, seen, rate = num("since"), num("seen") + cost, num("rate")
  if since == 0 then since = now end
  local elapsed = now - since
  if elapsed >= 1000000 then
    rate = math.floor(seen * 1000000 / elapsed)
    since, seen = now, 0
    redis.call("HSET", pool, "rate", fmt(rate))
  elseif elapsed >= 200000 then
    local current = math.floor(seen * 1000000 / elapsed)
    if current > rate then rate = current end
  end
  redis.call("HSET", pool, "since", fmt(since), "seen", fmt(seen))
  local down = num("down") > 0
  if verdict == 0 and fallback > 0 and down and cost > 0 then
    local window = math.floor(now / math.max(period, 1))
    local count = num("fbc")
    if num("fbw") ~= window then count = 0 end
    if count + cost <= fallback then
      verdict = 2
      redis.call("HSET", pool, "fbw", fmt(window), "fbc", fmt(count + cost))
      redis.call("HINCRBY", pool, "fb", cost)
    end
  end
  local slot, give, waiting = -1, 0, 0
  local lock, dry = num("lock"), num("dry")
  local low = num("low")
  if left < math.max(low, 1) or left < cost then
    if now >= lock and now >= dry then
      -- Renew: an ended slot, else the one ending first.
      if not valid(0) then slot = 0
      elseif not valid(1) then slot = 1
      elseif slots[0].untl <= slots[1].untl then slot = 0
      else slot = 1 end
      give = slots[slot].left
      redis.call("HSET", pool, "l" .. slot, "0", "lock", fmt(now + lock_ms * 1000),
                 "tok", token)
    elseif now < lock and now >= dry and not down and num("short") == 0 then
      waiting = 1
    end
  end
  keep(ttl)
  local dry_wait = 0
  if dry > now then dry_wait = dry - now end
  return { now, verdict, left, slot + 1, give, rate, waiting, dry_wait, down and 1 or 0,
           num("hreset"), took, num("short") }
end

-- "idle" idle_us, lock_ms, token: when the region has spent nothing for idle_us and no
--   renewal is under way, elects the caller to give a slot's units back to home (a share an
--   idle region holds is quota the others cannot spend). Reply: { now, slot + 1 (0: none),
--   give }.
if op == "idle" then
  local idle, lock_ms, token = clamp(ARGV[3]), clamp(ARGV[4]), ARGV[5]
  load()
  if now - num("last") < idle or now < num("lock") then return { now, 0, 0 } end
  local slot = nil
  for s = 0, 1 do
    if valid(s) and (slot == nil or slots[s].left > slots[slot].left) then slot = s end
  end
  if slot == nil then return { now, 0, 0 } end
  local give = slots[slot].left
  redis.call("HSET", pool, "l" .. slot, "0", "lock", fmt(now + lock_ms * 1000), "tok", token)
  return { now, slot + 1, give }
end

if op == "deposit" then
  local token, slot = ARGV[3], clamp(ARGV[4])
  local units, untl = clamp(ARGV[5]), clamp(ARGV[6])
  local remaining, reset, dry, ttl = clamp(ARGV[7]), clamp(ARGV[8]), clamp(ARGV[9]),
                                     clamp(ARGV[10])
  local short = ARGV[11] or "0"
  if redis.call("HGET", pool, "tok") ~= token then return 0 end
  redis.call("HSET", pool, "l" .. slot, fmt(units), "u" .. slot, fmt(untl), "n" .. slot,
             fmt(units), "lock", "0", "tok", "", "down", "0", "hr", fmt(remaining),
             "hreset", fmt(reset), "dry", fmt(dry), "short", short)
  if units > 0 then
    redis.call("HSET", pool, "low", fmt(math.floor((units + 1) / 2)))
  end
  keep(ttl)
  return 1
end

if op == "failed" then
  local token, retry = ARGV[3], clamp(ARGV[4])
  if redis.call("HGET", pool, "tok") ~= token then return 0 end
  local down = num("down")
  if down == 0 then down = now end
  redis.call("HSET", pool, "lock", fmt(now + retry * 1000), "tok", "", "down", fmt(down))
  return 1
end

if op == "unspend" then
  local units, took = clamp(ARGV[3]), clamp(ARGV[4])
  load()
  local slot = nil
  for s = 0, 1 do
    if slots[s].untl > now and slots[s].untl <= took and
       (slot == nil or slots[s].untl < slots[slot].untl) then
      slot = s
    end
  end
  if slot == nil then return 0 end
  local back = math.min(units, math.max(slots[slot].units - slots[slot].left, 0))
  if back <= 0 then return 0 end
  redis.call("HINCRBY", pool, "l" .. slot, back)
  redis.call("HINCRBY", pool, "spent", -back)
  return back
end

if op == "peek" then
  load()
  return { now, slots[0].left, slots[0].untl, slots[0].units, slots[1].left, slots[1].untl,
           slots[1].units, num("spent"), num("fb"), num("down"), num("hr"), num("hreset"),
           num("lock") }
end

return redis.error_reply("sluice: unknown share operation " .. tostring(op))
