-- main: a batch of requests (group commit), decided one after the other in the order they
-- are sent, each exactly as if it were alone: mirroring src/limiter/memory/decide.rs and
-- src/limiter/plan.rs per request. Every request reads the keys as the requests before it in
-- the batch wrote them; all share one `now`.

-- The clock.
local now
if ARGV[1] ~= "" then
  now = clamp(ARGV[1])
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Parse the limits, each once: its algorithm, its parameters, whether it charges always.
-- An algorithm's functions are made on its first use in the request.
local limits, made = {}, {}
local nlimits = tonumber(ARGV[2]) or 0
for l = 1, nlimits do
  local at = 5 * l - 2
  local code = ARGV[at]
  local algo = made[code]
  if algo == nil then
    if type(MAKERS[code]) ~= "function" then
      return redis.error_reply("sluice: unknown algorithm code " .. tostring(code))
    end
    algo = MAKERS[code]()
    made[code] = algo
  end
  local flags = tonumber(ARGV[at + 4]) or 0
  limits[l] = {
    A = algo,
    p = algo.params(clamp(ARGV[at + 1]), clamp(ARGV[at + 2]), clamp(ARGV[at + 3]),
                    flags % 2 == 1),
    always = flags >= 2,
  }
end

-- Parse every request's hits before deciding any (a malformed one fails the whole call
-- before anything is written). Role codes in capitals ask for a refund. A hit is a positional
-- table (its array part costs half what named fields do, per hit and call), indexed by these:
local SLOT, ALGO, PARAMS, ALWAYS, COST, REFUND = 1, 2, 3, 4, 5, 6
local GROUP, ROLE, OK, WAIT, STATE, CHANGED = 7, 8, 9, 10, 11, 12
local requests = {}
local at = 4 + 5 * nlimits
local nrequests = tonumber(ARGV[3 + 5 * nlimits]) or 0
for r = 1, nrequests do
  local mode, count = ARGV[at], tonumber(ARGV[at + 1]) or 0
  if mode ~= "request" and mode ~= "independent" then
    return redis.error_reply("sluice: malformed request " .. r)
  end
  local hits = {}
  for h = 1, count do
    local f = at + 2 + 5 * (h - 1)
    local slot, limit, code = tonumber(ARGV[f]), limits[tonumber(ARGV[f + 1])], ARGV[f + 4]
    local refund = code == "E" or code == "S" or code == "Q"
    if refund then code = code == "E" and "e" or (code == "S" and "s" or "q") end
    if limit == nil or KEYS[slot] == nil or (code ~= "e" and code ~= "s" and code ~= "q") then
      return redis.error_reply("sluice: malformed hit " .. h .. " of request " .. r)
    end
    -- Set below: OK, admitted by its own limit; WAIT, when denied, until it would be; on the
    -- first hit on a key, its STATE (the original, then the committed one) and whether a cost
    -- CHANGED it.
    hits[h] = { slot, limit.A, limit.p, limit.always, clamp(ARGV[f + 2]), refund, ARGV[f + 3],
                code, true, 0, false, false }
  end
  requests[r] = { hits = hits, count = count, independent = mode == "independent" }
  at = at + 2 + 5 * count
end

-- Each request in turn: evaluate, plan, commit, report (appended to `reply`), write. (A loop,
-- not a function: the script runs whole on every call, and a closure costs per call.)
local reply, n = {}, 0
for r = 1, nrequests do
  local request = requests[r]
  local hits, count, independent = request.hits, request.count, request.independent
  -- The original states, each read by the algorithm of the first hit on its key, and kept in
  -- that hit.
  local first, distinct = {}, 0
  for h = 1, count do
    local hit = hits[h]
    local s = hit[SLOT]
    if first[s] == nil then
      distinct = distinct + 1
      first[s] = hit
      hit[STATE] = hit[ALGO].load(KEYS[s], hit[PARAMS], now)
    end
  end

  -- Evaluate in order; a hit sees the tentative effect of earlier hits on its key. A tentative
  -- state is only made for a key that a later hit reads (`uses_left`, only counted when some
  -- key of the request has several hits). A denied hit's wait is its report.
  local uses_left, overlay = nil, nil
  if distinct < count then
    uses_left, overlay = {}, {}
    for h = 1, count do
      local s = hits[h][SLOT]
      uses_left[s] = (uses_left[s] or 0) + 1
    end
  end
  local all_ok = true
  for h = 1, count do
    local hit = hits[h]
    local s = hit[SLOT]
    local state = first[s][STATE]
    if overlay ~= nil and overlay[s] ~= nil then state = overlay[s] end
    local ok = hit[REFUND] or hit[ALGO].admits(hit[PARAMS], state, now, hit[COST])
    if not ok then
      hit[OK] = false
      hit[WAIT] = hit[ALGO].until_admitted(hit[PARAMS], state, now, hit[COST])
      all_ok = false
    end
    if uses_left ~= nil then
      local later = uses_left[s] - 1
      uses_left[s] = later
      if later > 0 and (ok or hit[ALWAYS]) then
        -- The hit's cost taken (or given back), as a new state: states are never modified in
        -- place (the commit below starts again from the originals).
        local apply = hit[REFUND] and hit[ALGO].give or hit[ALGO].take
        overlay[s] = apply(hit[PARAMS], state, now, hit[COST])
      end
    end
  end

  -- Plan: per descriptor group, then the request (when every hit admits, so does everything).
  local request_ok, group_ok = true, nil
  if not all_ok then
    group_ok = {}
    local roles = {}
    for h = 1, count do
      local g = hits[h][GROUP]
      if group_ok[g] == nil then
        group_ok[g] = true
        roles[g] = hits[h][ROLE]
      end
      group_ok[g] = group_ok[g] and hits[h][OK]
    end
    local quota_seen, quota_ok, enforced_denied = false, false, false
    for g, ok in pairs(group_ok) do
      local role = roles[g]
      if role == "e" then
        enforced_denied = enforced_denied or not ok
      elseif role == "q" then
        quota_seen = true
        quota_ok = quota_ok or ok
      end
    end
    request_ok = not enforced_denied and (not quota_seen or quota_ok)
  end

  -- Commit from the original states, in order (in place: the originals are not read again);
  -- remember which keys a cost was applied to.
  for h = 1, count do
    local hit = hits[h]
    local go = all_ok or (group_ok[hit[GROUP]] and (request_ok or independent))
    if (go or hit[ALWAYS]) and hit[COST] > 0 then
      local key = first[hit[SLOT]]
      local apply = hit[REFUND] and hit[ALGO].give or hit[ALGO].take
      key[STATE] = apply(hit[PARAMS], key[STATE], now, hit[COST])
      key[CHANGED] = true
    end
  end

  -- Report (before writing: a state may still read its stored key).
  n = n + 1
  reply[n] = request_ok and 1 or 0
  for h = 1, count do
    local hit = hits[h]
    if hit[OK] then
      local fin = first[hit[SLOT]][STATE]
      reply[n + 1] = 1
      reply[n + 2] = hit[ALGO].remaining(hit[PARAMS], fin, now)
      reply[n + 3] = hit[ALGO].reset(hit[PARAMS], fin, now)
    else
      reply[n + 1] = 0
      reply[n + 2] = 0
      reply[n + 3] = hit[WAIT]
    end
    n = n + 3
  end

  -- Write: keys no cost touched are left alone; the others are stored until they are fresh
  -- (judged by the limit of their first hit), or deleted when they already are.
  for s, hit in pairs(first) do
    if hit[CHANGED] then
      local fresh_at = hit[ALGO].fresh_at(hit[PARAMS], hit[STATE], now)
      if fresh_at then
        hit[ALGO].save(KEYS[s], hit[PARAMS], hit[STATE], now, fresh_at)
      else
        redis.call("DEL", KEYS[s])
      end
    end
  end
end
return reply
