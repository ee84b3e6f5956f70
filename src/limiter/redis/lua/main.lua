-- main: one request, mirroring src/limiter/memory/decide.rs and src/limiter/plan.rs.

-- The algorithms this request uses, built on first use.
local ALGOS = {}
local function algorithm(code)
  local made = ALGOS[code]
  if made == nil then
    local make = MAKERS[code]
    if make == nil then return nil end
    made = make()
    ALGOS[code] = made
  end
  return made
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
  local at = 4 + 11 * h
  local algo = algorithm(ARGV[at + 1])
  if algo == nil then
    return redis.error_reply("sluice: unknown algorithm code " .. tostring(ARGV[at + 1]))
  end
  hits[h + 1] = {
    slot = tonumber(ARGV[at]),
    A = algo,
    p = algo.params(clamp(ARGV[at + 2]), clamp(ARGV[at + 3]), clamp(ARGV[at + 4]),
                    ARGV[at + 5] == "1"),
    always = ARGV[at + 6] == "1",
    cost = clamp(ARGV[at + 7]),
    refund = ARGV[at + 8] == "1",
    group = ARGV[at + 9],
    role = ARGV[at + 10],
  }
end

-- The original states, each read by the algorithm of the first hit on its key.
local first, originals = {}, {}
for _, hit in ipairs(hits) do
  if first[hit.slot] == nil then
    first[hit.slot] = hit
    originals[hit.slot] = hit.A.load(KEYS[hit.slot], hit.p, now)
  end
end

-- A hit's cost taken (or given back), as a new state; states are never modified in place.
local function apply(hit, state)
  if hit.refund then return hit.A.give(hit.p, state, now, hit.cost) end
  return hit.A.take(hit.p, state, now, hit.cost)
end

-- Evaluate in order; a hit sees the tentative effect of earlier hits on its key.
local overlay = {}
for s, state in pairs(originals) do overlay[s] = state end
local admitted, waits = {}, {}
for i, hit in ipairs(hits) do
  local state = overlay[hit.slot]
  local ok = hit.refund or hit.A.admits(hit.p, state, now, hit.cost)
  if not ok then waits[i] = hit.A.until_admitted(hit.p, state, now, hit.cost) end
  if ok or hit.always then overlay[hit.slot] = apply(hit, state) end
  admitted[i] = ok
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

-- Commit from the original states, in order; remember which keys a cost was applied to.
local finals, changed = {}, {}
for s, state in pairs(originals) do finals[s] = state end
for _, hit in ipairs(hits) do
  local go = groups[hit.group].ok and (request_ok or independent)
  if (hit.always or go) and hit.cost > 0 then
    finals[hit.slot] = apply(hit, finals[hit.slot])
    changed[hit.slot] = true
  end
end

-- Report (before writing: a state may still read its stored key).
local reply = { request_ok and 1 or 0 }
for i, hit in ipairs(hits) do
  if admitted[i] then
    local fin = finals[hit.slot]
    reply[#reply + 1] = 1
    reply[#reply + 1] = hit.A.remaining(hit.p, fin, now)
    reply[#reply + 1] = hit.A.reset(hit.p, fin, now)
  else
    reply[#reply + 1] = 0
    reply[#reply + 1] = 0
    reply[#reply + 1] = waits[i]
  end
end

-- Write: keys no cost touched are left alone; the others are stored until they are fresh
-- (judged by the limit of their first hit), or deleted when they already are.
for s, hit in pairs(first) do
  if changed[s] then
    local fresh_at = hit.A.fresh_at(hit.p, finals[s], now)
    if fresh_at then
      hit.A.save(KEYS[s], hit.p, finals[s], now, fresh_at)
    else
      redis.call("DEL", KEYS[s])
    end
  end
end

return reply
