-- sluice: one request's funnel limits, decided atomically (all or nothing).
--
-- Mirrors src/limiter/funnel.rs (the funnel), src/limiter/plan.rs (all or nothing) and
-- src/limiter/memory/decide.rs (evaluate with an overlay, plan, commit from the original
-- states, report, write). Any change there must be made here too; tests/redis_differential.rs
-- checks that both give identical outcomes.
--
-- Time unit: MICROSECONDS. Lua numbers are doubles, exact for integers up to 2^53 - 1; Unix
-- time in microseconds is about 2^51 today, so every time and duration below is exact.
-- Arithmetic saturates at MAX = 2^53 - 1 (the Rust funnel saturates at 2^64 - 1; the two agree
-- whenever neither saturates, i.e. for any state less than ~250 years ahead of now).
--
-- KEYS[s]      the distinct state keys of the request (prefix included), s = 1..#KEYS, in
--              order of first appearance. Every key the script touches is in KEYS, so Redis
--              Cluster routes the call (all keys of one call must share a slot there).
--
-- ARGV[1]      "now" override in microseconds, or "" to read Redis TIME (the normal case).
--              Only tests set it, to drive the script on a controlled clock.
-- ARGV[2]      mode: "request" (all or nothing over the hits of this call) or "independent"
--              (each descriptor group consumes when all of its hits admit, whatever the
--              others do; used for one slot group of a Redis Cluster request, the caller then
--              plans the whole request and refunds what must not have been consumed).
-- ARGV[3]      H, the number of hits; then 10 fields per hit h = 0..H-1, at 4 + 10*h:
--   +0 slot    index into KEYS (1-based) of the hit's state key
--   +1 quota   Q, requests per period (0 = zero quota)
--   +2 period  P in microseconds (>= 1 after clamping)
--   +3 burst   B
--   +4 borrow  "1" or "0"
--   +5 always  "1" when the limit has charge: always, else "0"
--   +6 cost    the cost (0 = check only)
--   +7 refund  "1" to give the cost back (is_negative_hits), else "0"
--   +8 group   the descriptor the hit belongs to (any string; equal for one descriptor)
--   +9 role    "e" enforced, "s" shadow, "q" quota mode
--
-- Reply: { request_admitted, then per hit: admitted, remaining, reset_micros }, all integers
-- (admitted flags are 1 or 0). reset_micros: for an admitted hit, until the funnel is empty;
-- for a denied one, until this hit would be admitted.
--
-- Storage: each key holds its funnel's tat (the time it will be empty) as a decimal integer
-- string. A key whose state becomes fresh (tat <= now) is deleted; a key that changes gets a
-- TTL of exactly the time until it is fresh again, rounded up to the millisecond.

local MAX = 9007199254740991
local FRESH = 0

local function sat_add(a, b)
  local s = a + b
  if s > MAX then return MAX end
  return s
end

local function sat_mul(a, b)
  local p = a * b
  if p > MAX then return MAX end
  return p
end

local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

-- floor(a / b) for integers 0 <= a <= MAX, b >= 1, corrected for the rounding of the division.
local function div_floor(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end

local function clamp(text)
  local n = tonumber(text) or 0
  if n > MAX then return MAX end
  if n < 0 then return 0 end
  return math.floor(n)
end

-- Funnel::new
local function funnel(quota, period, burst, borrow)
  if period < 1 then period = 1 end
  local interval = 0
  if quota > 0 then
    interval = div_floor(period, quota)
    if interval * quota < period then interval = interval + 1 end
    if interval < 1 then interval = 1 end
  end
  return { interval = interval, tolerance = sat_mul(interval, burst), period = period,
           borrow = borrow }
end

local function consume(f, tat, now, cost)
  if f.interval == 0 or cost == 0 then return tat end
  return sat_add(math.max(tat, now), sat_mul(cost, f.interval))
end

local function probe_of(f, cost)
  if f.borrow then return math.min(cost, 1) end
  return cost
end

local function evaluate(f, tat, now, cost)
  if f.interval == 0 then return cost == 0 end
  return sat_sub(consume(f, tat, now, probe_of(f, cost)), now) <= f.tolerance
end

local function refund(f, tat, now, cost)
  if f.interval == 0 then return tat end
  local back = sat_sub(tat, sat_mul(cost, f.interval))
  if back <= now then return FRESH end
  return back
end

local function remaining(f, tat, now)
  if f.interval == 0 then return 0 end
  return div_floor(sat_sub(f.tolerance, sat_sub(tat, now)), f.interval)
end

local function until_empty(tat, now)
  return sat_sub(tat, now)
end

local function until_admitted(f, tat, now, cost)
  if f.interval == 0 then return f.period end
  local probe = probe_of(f, cost)
  local wait
  if sat_mul(probe, f.interval) > f.tolerance then
    wait = math.max(until_empty(tat, now), f.period)
  else
    wait = sat_sub(sat_sub(consume(f, tat, now, probe), now), f.tolerance)
  end
  return math.max(wait, 1)
end

local function apply(hit, tat, now)
  if hit.refund then return refund(hit.f, tat, now, hit.cost) end
  return consume(hit.f, tat, now, hit.cost)
end

-- The clock.
local now
if ARGV[1] ~= "" then
  now = clamp(ARGV[1])
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local independent = ARGV[2] == "independent"

-- Parse the hits.
local hits = {}
local count = tonumber(ARGV[3]) or 0
for h = 0, count - 1 do
  local at = 4 + 10 * h
  hits[h + 1] = {
    slot = tonumber(ARGV[at]),
    f = funnel(clamp(ARGV[at + 1]), clamp(ARGV[at + 2]), clamp(ARGV[at + 3]),
               ARGV[at + 4] == "1"),
    always = ARGV[at + 5] == "1",
    cost = clamp(ARGV[at + 6]),
    refund = ARGV[at + 7] == "1",
    group = ARGV[at + 8],
    role = ARGV[at + 9],
  }
end

-- The original states.
local originals = {}
for s = 1, #KEYS do
  originals[s] = clamp(redis.call("GET", KEYS[s]) or "0")
end

-- Evaluate in order; a hit sees the tentative effect of earlier hits on its key.
local overlay = {}
for s = 1, #KEYS do overlay[s] = originals[s] end
local admitted, against = {}, {}
for i, hit in ipairs(hits) do
  local tat = overlay[hit.slot]
  local ok = hit.refund or evaluate(hit.f, tat, now, hit.cost)
  if ok or hit.always then overlay[hit.slot] = apply(hit, tat, now) end
  admitted[i] = ok
  against[i] = tat
end

-- Plan: per descriptor group, then the request.
local groups = {}
for i, hit in ipairs(hits) do
  local g = groups[hit.group]
  if g == nil then
    g = { role = hit.role, ok = true }
    groups[hit.group] = g
  end
  g.ok = g.ok and admitted[i]
end
local quota_seen, quota_ok, enforced_denied = false, false, false
for _, g in pairs(groups) do
  if g.role == "e" then
    enforced_denied = enforced_denied or not g.ok
  elseif g.role == "q" then
    quota_seen = true
    quota_ok = quota_ok or g.ok
  end
end
local request_ok = not enforced_denied and (not quota_seen or quota_ok)

-- Commit from the original states, in order.
local finals = {}
for s = 1, #KEYS do finals[s] = originals[s] end
for _, hit in ipairs(hits) do
  local go = groups[hit.group].ok and (request_ok or independent)
  if hit.always or go then
    finals[hit.slot] = apply(hit, finals[hit.slot], now)
  end
end

-- Write: unchanged keys are left alone, fresh ones deleted, the rest stored with a TTL.
for s = 1, #KEYS do
  local new = finals[s]
  if new ~= originals[s] then
    if new > now then
      local ttl_ms = math.floor((new - now + 999) / 1000)
      redis.call("SET", KEYS[s], string.format("%.0f", new), "PX", string.format("%.0f", ttl_ms))
    else
      redis.call("DEL", KEYS[s])
    end
  end
end

-- Report.
local reply = { request_ok and 1 or 0 }
for i, hit in ipairs(hits) do
  if admitted[i] then
    local fin = finals[hit.slot]
    reply[#reply + 1] = 1
    reply[#reply + 1] = remaining(hit.f, fin, now)
    reply[#reply + 1] = until_empty(fin, now)
  else
    reply[#reply + 1] = 0
    reply[#reply + 1] = 0
    reply[#reply + 1] = until_admitted(hit.f, against[i], now, hit.cost)
  end
end
return reply
