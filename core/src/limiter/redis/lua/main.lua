-- main: a batch of requests (group commit), decided one after the other in the order they
-- are sent, each exactly as if it were alone: mirroring src/limiter/memory/decide.rs and
-- src/limiter/plan.rs per request. Every request reads the keys as the requests before it in
-- the batch wrote them; all share one `now`.

floor, format = math.floor, string.format

-- The clock.
local now = clock(ARGV[1])

-- Parse the limits, each once: its algorithm, its parameters, whether it charges always, its
-- penalty box (0: none) and, for calendar windows, the windows around now (see the prelude).
-- An algorithm's functions are made on its first use in the request.
local limit_algo, limit_params, limit_always, limit_pending, limit_block, limit_code, made =
  {}, {}, {}, {}, {}, {}, {}
local nlimits = tonumber(ARGV[2]) or 0
for l = 1, nlimits do
  local at = 7 * l - 4
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
  limit_algo[l], limit_code[l] = algo, code
  limit_params[l] = algo.params(clamp(ARGV[at + 1]), clamp(ARGV[at + 2]), clamp(ARGV[at + 3]),
                                flags % 2 == 1)
  -- A concurrency limit's `charge: always` keeps a denied request's cost as a pending denial
  -- (its `deny`), never as a hold.
  limit_always[l] = flags >= 2 and not algo.deny
  limit_pending[l] = flags >= 2 and algo.deny ~= nil
  limit_block[l] = clamp(ARGV[at + 5])
  local window = ARGV[at + 6]
  if window ~= nil and window ~= "" then
    local a, b, c, d = string.match(window, "^(%d+),(%d+),(%d+),(%d+)$")
    if a == nil or code ~= "w" then
      return redis.error_reply("sluice: malformed calendar window of limit " .. l)
    end
    local p = limit_params[l]
    p.cal_previous, p.cal_start, p.cal_end, p.cal_next = tonumber(a), tonumber(b), tonumber(c),
      tonumber(d)
  end
end

-- Unpack every request's hits from the binary ARGV before deciding any (a malformed one fails
-- the whole call before anything is written). No table per hit: one array per field, indexed
-- by the hit's number in the batch (i = 1..total), the hit's limit by its index l (its
-- algorithm, parameters and charge are limit_algo[l], limit_params[l], limit_always[l]); a
-- request is the run of hits from req_first[r], req_count[r] long.
local nrequests = tonumber(ARGV[3 + 7 * nlimits]) or 0
local blob = ARGV[4 + 7 * nlimits] or ""
local size, read, pack = #blob, struct.unpack, struct.pack
local hit_slot, hit_limit, hit_cost = {}, {}, {}
local hit_refund, hit_group, hit_role, hit_hold = {}, {}, {}, {}
local req_first, req_count, req_independent, req_dry = {}, {}, {}, {}
-- The lease requests (mode 3) apart: lease_hit[k] their one hit, and lease_args[k] what
-- follows it ({give, validity, replica}); the others are requests 1..nplain.
-- (made at the first lease request: a call without one makes neither table)
local lease_hit, lease_args, nleases, nplain = nil, nil, 0, 0
local pos, total = 1, 0
for r = 1, nrequests do
  if pos + REQUEST_BYTES - 1 > size then
    return redis.error_reply("sluice: malformed request " .. r)
  end
  local mode, count
  mode, count, pos = read(REQUEST_FORMAT, blob, pos)
  if mode > LEASE_MODE or pos + HIT_BYTES * count - 1 > size
     or (mode == LEASE_MODE and count ~= 1) then
    return redis.error_reply("sluice: malformed request " .. r)
  end
  if mode == LEASE_MODE then
    if nleases == 0 then lease_hit, lease_args = {}, {} end
    nleases = nleases + 1
    lease_hit[nleases] = total + 1
  else
    nplain = nplain + 1
    req_first[nplain], req_count[nplain], req_independent[nplain] = total + 1, count, mode == 1
    req_dry[nplain] = mode == 2
  end
  for h = 1, count do
    local slot, limit, cost, group, role
    slot, limit, cost, group, role, pos = read(HIT_FORMAT, blob, pos)
    local hold = false
    if role >= ROLE_HOLD then
      if pos + HOLD_BYTES - 1 > size then
        return redis.error_reply("sluice: malformed hit " .. h .. " of request " .. r)
      end
      hold, pos = read(HOLD_FORMAT, blob, pos)
      role = role - ROLE_HOLD
      if not (hold >= 0) then hold = 0 end
      hold = hold - hold % 1
    end
    local refund = role >= 8
    if refund then role = role - 8 end
    local algo = limit_algo[limit]
    if algo == nil or KEYS[slot] == nil or role > 3 or not (cost >= 0) then
      return redis.error_reply("sluice: malformed hit " .. h .. " of request " .. r)
    end
    -- floor(cost) without a call (cost is at least 0 here)
    if cost > MAX then cost = MAX else cost = cost - cost % 1 end
    total = total + 1
    hit_slot[total], hit_limit[total], hit_cost[total], hit_refund[total] = slot, limit, cost,
      refund
    hit_group[total], hit_role[total] = group, role
    -- a hold id only means something to an algorithm with holds (concurrency)
    hit_hold[total] = algo.take_id ~= nil and hold
  end
  if mode == LEASE_MODE then
    if pos + LEASE_BYTES - 1 > size then
      return redis.error_reply("sluice: malformed lease request " .. r)
    end
    local give, least, validity, replica, deadline
    give, least, validity, replica, deadline, pos = read(LEASE_FORMAT, blob, pos)
    lease_args[nleases] = { clamp(give), clamp(validity), clamp(replica), clamp(least),
                            clamp(deadline) }
  end
end
if pos ~= size + 1 then
  return redis.error_reply("sluice: malformed requests (" .. size - pos + 1 .. " bytes left)")
end

-- Read every key whose state is a string (see `algorithm` in the prelude) before deciding
-- anything: one MGET for the call (one per MGET_KEYS keys), not one GET per key and request.
-- key_text[s] is then the text of KEYS[s] as the requests decided so far left it (false:
-- absent); a request's write updates it, and the keys changed are written after the last
-- request (see the end). A sliding log's key (a sorted set) is read by the log itself: when a
-- limit of the call is one (or a concurrency limit, also a sorted set), only the other hits'
-- keys are read here.
local key_text = {}
do
  local names, slots = KEYS, nil
  if made.l or made.c then
    names, slots = {}, {}
    local seen = {}
    for i = 1, total do
      local s = hit_slot[i]
      if limit_algo[hit_limit[i]].text and not seen[s] then
        seen[s] = true
        slots[#slots + 1] = s
        names[#names + 1] = KEYS[s]
      end
    end
  end
  local count = #names
  if slots == nil and count <= MGET_KEYS then
    if count > 0 then key_text = redis.call("MGET", unpack(names)) end
  else
    for from = 1, count, MGET_KEYS do
      local to = math.min(from + MGET_KEYS - 1, count)
      local got = redis.call("MGET", unpack(names, from, to))
      for j = from, to do key_text[slots and slots[j] or j] = got[j - from + 1] end
    end
  end
end
-- The keys whose text a request changed, in the order first changed: dirty[1..ndirty], the
-- key's index, negated when Redis did not hold the key before the call. key_ttl[s], set once
-- the key is changed: its TTL in milliseconds, 0 when it is fresh again (to be deleted).
local dirty, ndirty, key_ttl = {}, 0, {}

-- Per key (index into KEYS), for the request being decided (key_request[s] == r): its first
-- hit, its STATE (the original, then the committed one), its tentative state (what the hits
-- evaluated so far made of it), how many of the request's hits on it are still to be
-- evaluated, and whether a cost CHANGED it. Reused from request to request. Made by the
-- first request the general path decides: a call the fast path decides whole makes none.
local key_request, key_first, key_state, key_tentative, key_uses, key_changed
-- Per hit: admitted by its own limit; when denied, the wait until it would be.
local hit_ok, hit_wait
-- Per key (index into KEYS) whose hits have a penalty box: until when it is blocked (0: not),
-- read from its block key on first use in the call, and as the requests so far left it.
local block_until = {}

-- Each request in turn: evaluate, plan, commit, report (appended to `reply`), write. (A loop,
-- not a function: the script runs whole on every call, and a closure costs per call.)
-- The fast path's (see below): the funnel, when a limit of the call is one; per key, the
-- request that last named it there; per hit, the tat it read and its refundable units.
local funnel, fast_seen, hit_tat, hit_back = made.f, {}, {}, {}
local U32 = 4294967295
local reply, n = {}, 0

-- The lease requests, first (see "Leases" in the prelude). A key's state is read and written
-- only through its algorithm's `load`, `admits`, `take`, `name_take`, `give_named`, `text`,
-- `fresh_at` (and the bucket's `next_step`), as the other requests read and write it
-- (key_text); its lease records directly.
if nleases > 0 then
  -- Where the count of state `st` at `at` starts over (lease::horizon).
  local function horizon(code, algo, p, st, at)
    if code == "f" then return MAX end
    if code == "b" then return algo.next_step(p, st, at) end
    if code == "w" then return sat_add(at, algo.reset(p, st, at)) end
    return sat_add(div_floor(at, p.period) * p.period, p.period)
  end
  for k = 1, nleases do
    local i = lease_hit[k]
    local s, l = hit_slot[i], hit_limit[i]
    local algo, p, code = limit_algo[l], limit_params[l], limit_code[l]
    local give, validity, replica = lease_args[k][1], lease_args[k][2], fmt(lease_args[k][3])
    local least = math.max(lease_args[k][4], 1)
    -- A request past its deadline does nothing: neither gives back nor takes.
    local late = lease_args[k][5] > 0 and now > lease_args[k][5]
    local leasable = (code == "f" or code == "b" or code == "w" or code == "s")
      and not p.borrow and not limit_always[l] and limit_block[l] == 0 and not hit_refund[i]
      and not late
    local want = leasable and hit_cost[i] or 0
    local records, text = KEYS[s] .. LEASE_SUFFIX, key_text[s]
    local state = algo.text and algo.load(text)
    local changed = false

    -- The old lease: its unused units back while they may come back; its record goes
    -- either way.
    local returned = 0
    local record = leasable and redis.call("HGET", records, replica)
    if record then
      local units, returnable, mark, left =
        string.match(record, "^(%d+):%d+:(%d+):(%d+):(.*)$")
      units, returnable, mark = tonumber(units) or 0, tonumber(returnable) or 0,
        tonumber(mark) or 0
      if give > 0 and now < returnable and (code ~= "f" or left == (text or "")) then
        returned = math.min(give, units)
        state = algo.give_named(p, state, now, returned, mark)
        changed = true
      end
      redis.call("HDEL", records, replica)
    end

    -- The new lease: at most a quarter of what remains (at least 1); the most units, a
    -- multiple of least up to want, the state admits where they are counted and, once taken there, still
    -- within its bound at now (monotone in the units: a binary search).
    local granted, expires, returnable, granted_mark = 0, 0, 0, 0
    if want > 0 then
      local share = floor(algo.remaining(p, state, now) / 4)
      if share < 1 then share = 1 end
      if want > share then want = share end
      expires = math.min(sat_add(now, validity), horizon(code, algo, p, state, now))
      if expires > now and want >= least then
        local last = expires - 1
        -- Counted at the last moment; a token bucket's at now (lease::counted_at).
        local at = last
        if code == "b" then at = now end
        -- In multiples of `least` (lease::grant_between): the largest k with k * least
        -- granted.
        local low, high, taken, mark = 0, floor(want / least), nil, 0
        while low < high do
          local mid = low + floor((high - low + 1) / 2)
          local t, m = nil, 0
          if algo.admits(p, state, at, mid * least) then
            t = algo.take(p, state, at, mid * least)
            if algo.admits(p, t, now, 0) then t, m = algo.name_take(p, t, at) else t = nil end
          end
          if t then low, taken, mark = mid, t, m else high = mid - 1 end
        end
        if low >= 1 then
          granted, state, changed, granted_mark = low * least, taken, true, mark
          -- Its units may come back until the count they were taken in starts over, as
          -- the take left it; a funnel's until its expiry.
          returnable = expires
          if code ~= "f" then returnable = horizon(code, algo, p, state, last) end
        end
      end
    end

    -- Written as the other requests write (key_text, then once after the last request).
    if changed then
      if key_ttl[s] == nil then
        ndirty = ndirty + 1
        dirty[ndirty] = key_text[s] and s or -s
      end
      local fresh_at = algo.fresh_at(p, state, now)
      if fresh_at then
        key_text[s], key_ttl[s] = algo.text(p, state), ttl_ms(now, fresh_at)
      else
        key_text[s], key_ttl[s] = false, 0
      end
    end
    if granted > 0 then
      redis.call("HSET", records, replica,
                 fmt(granted) .. ":" .. fmt(expires) .. ":" .. fmt(returnable) .. ":" ..
                 fmt(granted_mark) .. ":" .. (key_text[s] or ""))
      local ttl = ttl_ms(now, returnable)
      if redis.call("PTTL", records) < ttl then
        redis.call("PEXPIRE", records, ttl)
      end
    end
    local left, reset = 0, 0
    if leasable then left, reset = algo.remaining(p, state, now), algo.reset(p, state, now) end
    reply[n + 1], reply[n + 2], reply[n + 3], reply[n + 4], reply[n + 5], reply[n + 6] =
      now, returned, granted, expires, left, reset
    n = n + 6
  end
end

for r = 1, nplain do
  local first, last, independent = req_first[r], req_first[r] + req_count[r] - 1,
    req_independent[r]

  -- The fast path: a request whose hits are all funnel hits on distinct keys, none a refund,
  -- and which every hit admits, is decided here without the general path's bookkeeping and
  -- calls (its arithmetic is funnel.lua's admits, take, remaining, reset and fresh_at,
  -- written out). With distinct keys no hit sees another's tentative state, and with every
  -- hit admitted the plan admits the request and commits every cost. Otherwise nothing is
  -- changed here and the general path below decides the request.
  local fast = funnel ~= nil and not req_dry[r]
  if fast then
    for i = first, last do
      local s = hit_slot[i]
      local l = hit_limit[i]
      if limit_algo[l] ~= funnel or hit_refund[i] or fast_seen[s] == r or limit_block[l] > 0 then
        fast = false
        break
      end
      fast_seen[s] = r
      -- funnel.lua's load, written out (no parse of an absent key) for the packed state; an
      -- older text state, or one taken under another quota, goes to the general path (which
      -- reads the one and converts the other, Funnel::tat_of).
      local p, cost, tat, back, text = limit_params[l], hit_cost[i], 0, 0, key_text[s]
      if text then
        local mark, q
        if #text == 25 then mark, tat, q, back = read("<Bddd", text) end
        if mark ~= STATE_MARK or (q ~= p.quota and q ~= 0) then
          fast = false
          break
        end
        -- clamp_number, written out (a NaN fails every comparison)
        if tat > MAX then tat = MAX elseif tat >= 0 then tat = tat - tat % 1 else tat = 0 end
        if back > U32 then back = U32 elseif back >= 0 then back = back - back % 1 else back = 0 end
        if tat <= now then back = 0 end
      end
      local interval = p.interval
      if interval == 0 then
        fast = cost == 0
      else
        local probe = cost
        if p.borrow and probe > 1 then probe = 1 end
        local ahead = tat
        if probe > 0 then
          if ahead < now then ahead = now end
          ahead = ahead + probe * interval
          if ahead > MAX then ahead = MAX end
        end
        fast = ahead - now <= p.tolerance
      end
      if not fast then break end
      hit_tat[i], hit_back[i] = tat, back
    end
  end
  if fast then
    n = n + 1
    reply[n] = 1
    for i = first, last do
      local s, p, cost, tat = hit_slot[i], limit_params[hit_limit[i]], hit_cost[i], hit_tat[i]
      local interval, tolerance = p.interval, p.tolerance
      if cost > 0 then
        -- take (interval > 0: a cost above 0 is only admitted by a limit above 0), then
        -- write: the new tat is after now, so the key is stored until then.
        if tat < now then tat = now end
        tat = tat + cost * interval
        if tat > MAX then tat = MAX end
        -- Funnel::take's cap (met only by a borrowed cost: every other one here fits)
        local cap = now + tolerance + p.period
        if cap > MAX then cap = MAX end
        if cap < hit_tat[i] then cap = hit_tat[i] end
        if tat > cap then tat = cap end
        if key_ttl[s] == nil then
          ndirty = ndirty + 1
          dirty[ndirty] = key_text[s] and s or -s
        end
        -- ttl_ms(now, tat) written out: at least 1, tat being after now; funnel.lua's text
        -- (pack_state), the cost refundable
        local back = hit_back[i] + cost
        if back > U32 then back = U32 end
        key_text[s], key_ttl[s] = pack("<Bddd", STATE_MARK, tat, p.quota, back),
          floor((tat - now + 999) / 1000)
      end
      local ahead, left = tat - now, 0
      if interval > 0 and ahead < tolerance then
        -- div_floor(tolerance - max(ahead, 0), interval), written out
        local a = tolerance
        if ahead > 0 then a = tolerance - ahead end
        left = floor(a / interval)
        if left * interval > a then left = left - 1 end
        if (left + 1) * interval <= a then left = left + 1 end
      end
      if ahead < 0 then ahead = 0 end
      reply[n + 1], reply[n + 2] = left, ahead
      n = n + 2
    end
  else
    if key_request == nil then
      key_request, key_first, key_state, key_tentative, key_uses, key_changed = {}, {}, {}, {},
        {}, {}
      hit_ok, hit_wait = {}, {}
    end
    -- The original states, each read by the algorithm of the first hit on its key.
    for i = first, last do
      local s = hit_slot[i]
      if key_request[s] ~= r then
        key_request[s], key_first[s], key_uses[s], key_changed[s] = r, i, 1, false
        local l = hit_limit[i]
        local algo, state = limit_algo[l], nil
        if algo.text then
          state = algo.load(key_text[s])
        else
          state = algo.load(KEYS[s], limit_params[l], now)
        end
        key_state[s], key_tentative[s] = state, state
      else
        key_uses[s] = key_uses[s] + 1
      end
    end

    -- Evaluate in order; a hit sees the tentative effect of earlier hits on its key (states
    -- are never modified in place, so the original stays for the commit below). A tentative
    -- state is only made for a key that a later hit reads. A denied hit's wait is its report.
    local all_ok = true
    for i = first, last do
      local s, l, cost = hit_slot[i], hit_limit[i], hit_cost[i]
      local algo, p = limit_algo[l], limit_params[l]
      local state, refund = key_tentative[s], hit_refund[i]
      local ok, block = true, limit_block[l]
      if refund then
        ok = true
      elseif block > 0 then
        -- The penalty box (mirrors `penalty` in decide.rs): denied while blocked, the wait
        -- being the block's end; after it, a denial blocks the key for `block` from now.
        local blocked = block_until[s]
        if blocked == nil then
          blocked = clamp(redis.call("GET", KEYS[s] .. BLOCK_SUFFIX) or "0")
        end
        if blocked > now then
          ok = false
          hit_wait[i] = blocked - now
        else
          ok = algo.admits(p, state, now, cost)
          if not ok then
            hit_wait[i] = block
            blocked = sat_add(now, block)
            redis.call("SET", KEYS[s] .. BLOCK_SUFFIX, fmt(blocked), "PX",
                       format("%d", ttl_ms(now, blocked)))
          end
        end
        block_until[s] = blocked
      else
        ok = algo.admits(p, state, now, cost)
        if not ok then hit_wait[i] = algo.until_admitted(p, state, now, cost) end
      end
      hit_ok[i] = ok
      if not ok then all_ok = false end
      local later = key_uses[s] - 1
      key_uses[s] = later
      if later > 0 and (ok or limit_always[l]) then
        local hold = hit_hold[i]
        if hold then
          local apply = refund and algo.give_id or algo.take_id
          key_tentative[s] = apply(p, state, now, cost, hold)
        else
          local apply = refund and algo.give or algo.take
          key_tentative[s] = apply(p, state, now, cost)
        end
      end
    end

    -- Plan: per descriptor group, then the request (when every hit admits, so does everything).
    local request_ok, group_ok = true, nil
    if not all_ok then
      group_ok = {}
      local roles = {}
      for i = first, last do
        local g = hit_group[i]
        if group_ok[g] == nil then
          group_ok[g] = true
          roles[g] = hit_role[i]
        end
        group_ok[g] = group_ok[g] and hit_ok[i]
      end
      local quota_seen, quota_ok, enforced_denied = false, false, false
      for g, ok in pairs(group_ok) do
        local role = roles[g]
        if role == ROLE_ENFORCED then
          enforced_denied = enforced_denied or not ok
        elseif role == ROLE_QUOTA then
          quota_seen = true
          quota_ok = quota_ok or ok
        elseif role == ROLE_QUOTA_SHADOW then
          quota_seen = true
          quota_ok = true
        end
      end
      request_ok = not enforced_denied and (not quota_seen or quota_ok)
    end

    -- Commit from the original states, in order (in place: the originals are not read again);
    -- remember which keys a cost was applied to.
    for i = first, last do
      local go = all_ok or (group_ok[hit_group[i]] and (request_ok or independent))
      local cost = hit_cost[i]
      local l = hit_limit[i]
      if (go or limit_always[l]) and cost > 0 then
        local s, algo, hold = hit_slot[i], limit_algo[l], hit_hold[i]
        if hold then
          local apply = hit_refund[i] and algo.give_id or algo.take_id
          key_state[s] = apply(limit_params[l], key_state[s], now, cost, hold)
        else
          local apply = hit_refund[i] and algo.give or algo.take
          key_state[s] = apply(limit_params[l], key_state[s], now, cost)
        end
        key_changed[s] = true
      elseif cost > 0 and not hit_refund[i] and limit_pending[l] and not hit_hold[i] then
        -- a concurrency hit that does not consume keeps its cost as a pending denial (one
        -- naming its hold keeps nothing: its release names the hold too)
        local s = hit_slot[i]
        key_state[s] = limit_algo[l].deny(limit_params[l], key_state[s], now, cost)
        key_changed[s] = true
      end
    end

    -- Report (before writing: a state may still read its stored key), in the reply's short
    -- form (see the prelude). An admitted hit on the same key and limit as the admitted hit
    -- before it reads the same final state with the same parameters: its remaining and reset
    -- are that hit's, neither computed nor sent again.
    n = n + 1
    reply[n] = request_ok and 1 or 0
    local prev_slot, prev_params = nil, nil
    for i = first, last do
      if hit_ok[i] then
        local s, l = hit_slot[i], hit_limit[i]
        local p = limit_params[l]
        if s == prev_slot and p == prev_params then
          n = n + 1
          reply[n] = REPLY_SAME
        else
          local algo, fin = limit_algo[l], key_state[s]
          reply[n + 1], reply[n + 2] = algo.remaining(p, fin, now), algo.reset(p, fin, now)
          n = n + 2
          prev_slot, prev_params = s, p
        end
      else
        reply[n + 1], reply[n + 2] = REPLY_DENIED, hit_wait[i]
        n = n + 2
      end
    end

    -- Write: keys no cost touched are left alone; the others are stored until they are fresh
    -- (judged by the limit of their first hit), or deleted when they already are. A string
    -- state is written to key_text, for the next requests, and to Redis after the last one.
    -- A dry run (mode 2) writes nothing: its commit stays in key_state, for its report only.
    local written = last
    if req_dry[r] then written = first - 1 end
    for i = first, written do
      local s = hit_slot[i]
      if key_first[s] == i and key_changed[s] then
        local l = hit_limit[i]
        local algo, p, state = limit_algo[l], limit_params[l], key_state[s]
        local fresh_at = algo.fresh_at(p, state, now)
        if algo.text then
          if key_ttl[s] == nil then
            ndirty = ndirty + 1
            dirty[ndirty] = key_text[s] and s or -s
          end
          if fresh_at then
            key_text[s], key_ttl[s] = algo.text(p, state), ttl_ms(now, fresh_at)
          else
            key_text[s], key_ttl[s] = false, 0
          end
        elseif fresh_at then
          algo.save(KEYS[s], p, state, now, fresh_at)
        else
          redis.call("DEL", KEYS[s])
        end
      end
    end
  end
end

-- Each changed key written once, as the last request left it: SET with its TTL, or DEL (none
-- for a key that was absent before the call and is fresh again after it). The call runs
-- whole, alone, at one `now`, and Redis expires no key during it, so this leaves Redis as
-- writing at each request would have.
for d = 1, ndirty do
  local s = dirty[d]
  local held = s > 0
  if not held then s = -s end
  local text = key_text[s]
  if text then
    redis.call("SET", KEYS[s], text, "PX", format("%d", key_ttl[s]))
  elseif held then
    redis.call("DEL", KEYS[s])
  end
end

-- The reply: its n numbers packed into one binary string (see the prelude).
local packed, from = {}, 1
while from <= n do
  local to = from + REPLY_CHUNK - 1
  if to > n then to = n end
  packed[#packed + 1] = struct.pack("<" .. string.rep("d", to - from + 1),
                                    unpack(reply, from, to))
  from = to + 1
end
return table.concat(packed)
