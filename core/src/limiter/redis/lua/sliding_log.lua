-- sliding_log: mirrors src/limiter/sliding_log.rs.
--
-- State: a sorted set. Each entry of the log is a member "<time>:<cost>" scored by its time
-- (times are unique in a log); the member "sum" holds the sum of the costs, as the score
-- -1 - sum (below every time, so ranges of times never include it). Absent = empty.
--
-- A state here is a view of the stored log and of what this request did to it, without
-- writing: `n` stored entries (every one still counting: expired entries are dropped as the
-- key is read) summing `stored_sum`; `cut_n` of them removed from the newest end and
-- `cut_part` units from the newest remaining one (refunds; `cut_units` in all); then `added`,
-- entries appended after them, oldest first. A view is never modified: operations return a
-- new one. `save` applies the final view to the sorted set.
-- Made only when a request uses it (see MAKERS in the prelude).

MAKERS.l = MAKERS.l and function()
  local MAX_ENTRIES = 10000

  local function params(quota, period)
    if period < 1 then period = 1 end
    local cap = math.max(math.min(quota, MAX_ENTRIES), 1)
    return { quota = quota, period = period, max_entries = cap }
  end

  local function parse(member)
    local t, c = string.match(member, "^(%d+):(%d+)$")
    return clamp(t), clamp(c)
  end

  local function member(t, c)
    return fmt(t) .. ":" .. fmt(c)
  end

  local function load(key, l, now)
    local view = { key = key, n = 0, stored_sum = 0, cut_n = 0, cut_part = 0, cut_units = 0,
                   added = {}, added_sum = 0 }
    local score = redis.call("ZSCORE", key, "sum")
    if not score then return view end
    local sum = clamp(-1 - tonumber(score))
    local cutoff = now - l.period
    if cutoff >= 0 then
      local expired = redis.call("ZRANGEBYSCORE", key, "0", fmt(cutoff))
      if #expired > 0 then
        for _, m in ipairs(expired) do
          local _, c = parse(m)
          sum = sat_sub(sum, c)
        end
        redis.call("ZREMRANGEBYSCORE", key, "0", fmt(cutoff))
        if redis.call("ZCARD", key) <= 1 then
          redis.call("DEL", key)
          return view
        end
        redis.call("ZADD", key, fmt(-1 - sum), "sum")
      end
    end
    view.n = redis.call("ZCARD", key) - 1
    view.stored_sum = sum
    return view
  end

  local function copy(v)
    local added = {}
    for i, e in ipairs(v.added) do added[i] = e end
    return { key = v.key, n = v.n, stored_sum = v.stored_sum, cut_n = v.cut_n,
             cut_part = v.cut_part, cut_units = v.cut_units, added = added,
             added_sum = v.added_sum }
  end

  local function logged(v)
    return sat_add(sat_sub(v.stored_sum, v.cut_units), v.added_sum)
  end

  local function entries(v)
    return v.n - v.cut_n + #v.added
  end

  -- The k-th newest stored entry (k = 0: the newest), as time and cost, or nil.
  local function stored_from_newest(v, k)
    if k >= v.n then return nil end
    local got = redis.call("ZREVRANGEBYSCORE", v.key, "+inf", "0", "LIMIT", k, 1)
    if #got == 0 then return nil end
    return parse(got[1])
  end

  -- The newest entry of the view: time, cost, and whether it is an added one.
  local function back(v)
    local a = v.added
    if #a > 0 then return a[#a][1], a[#a][2], true end
    local t, c = stored_from_newest(v, v.cut_n)
    if t == nil then return nil end
    return t, c - v.cut_part, false
  end

  local function admits(l, v, now, cost)
    return count_admits(l.quota, logged(v), cost)
  end

  local function take(l, v, now, cost)
    if l.quota == 0 or cost == 0 then return v end
    v = copy(v)
    local bt, bc, in_added = back(v)
    if bt ~= nil and (bt >= now or entries(v) >= l.max_entries) then
      local t = math.max(bt, now)
      if in_added then
        v.added[#v.added] = { t, sat_add(bc, cost) }
      else
        -- The newest stored entry moves, whole, into the added ones.
        v.cut_n = v.cut_n + 1
        v.cut_part = 0
        v.cut_units = sat_add(v.cut_units, bc)
        v.added[#v.added + 1] = { t, sat_add(bc, cost) }
        v.added_sum = sat_add(v.added_sum, bc)
      end
    else
      v.added[#v.added + 1] = { now, cost }
    end
    v.added_sum = sat_add(v.added_sum, cost)
    return v
  end

  local function give(l, v, now, cost)
    if l.quota == 0 or cost == 0 then return v end
    v = copy(v)
    local left = cost
    while left > 0 do
      local a = v.added
      if #a > 0 then
        local e = a[#a]
        local take = math.min(left, e[2])
        if take == e[2] then a[#a] = nil else a[#a] = { e[1], e[2] - take } end
        v.added_sum = v.added_sum - take
        left = left - take
      else
        local t, c = stored_from_newest(v, v.cut_n)
        if t == nil then break end
        local rest = c - v.cut_part
        local take = math.min(left, rest)
        if take == rest then
          v.cut_n = v.cut_n + 1
          v.cut_part = 0
        else
          v.cut_part = v.cut_part + take
        end
        v.cut_units = v.cut_units + take
        left = left - take
      end
    end
    return v
  end

  local function remaining(l, v, now)
    if l.quota == 0 then return 0 end
    return sat_sub(l.quota, logged(v))
  end

  local function reset(l, v, now)
    local t = back(v)
    if t == nil then return 0 end
    return sat_sub(sat_add(t, l.period), now)
  end

  local function until_admitted(l, v, now, cost)
    if l.quota == 0 or cost > l.quota then
      return math.max(reset(l, v, now), l.period)
    end
    local need = sat_sub(sat_add(logged(v), cost), l.quota)
    if need == 0 then return 1 end
    -- Walk from the oldest entry until enough cost has left.
    local freed = 0
    local stored = v.n - v.cut_n
    local offset = 0
    while offset < stored do
      local batch = redis.call("ZRANGEBYSCORE", v.key, "0", "+inf", "LIMIT", offset,
                               math.min(64, stored - offset))
      if #batch == 0 then break end
      for i, m in ipairs(batch) do
        local t, c = parse(m)
        if offset + i == stored then c = c - v.cut_part end
        freed = sat_add(freed, c)
        if freed >= need then return math.max(sat_sub(sat_add(t, l.period), now), 1) end
      end
      offset = offset + #batch
    end
    for _, e in ipairs(v.added) do
      freed = sat_add(freed, e[2])
      if freed >= need then return math.max(sat_sub(sat_add(e[1], l.period), now), 1) end
    end
    return l.period
  end

  local function fresh_at(l, v, now)
    return fresh_after(now, reset(l, v, now))
  end

  -- SlidingLog::mark: the time of the newest entry.
  local function name_take(l, v, now)
    local t = back(v)
    return v, t or now
  end

  -- SlidingLog::return_units: from the entry of time `at` while it still counts. Called on a
  -- view just loaded (nothing cut or added): it changes the stored log itself and returns the
  -- view of the result.
  local function give_named(l, v, now, units, at)
    if l.quota == 0 or units == 0 or v.n == 0 then return v end
    local got = redis.call("ZRANGEBYSCORE", v.key, fmt(at), fmt(at))
    if #got == 0 then return v end
    local t, c = parse(got[1])
    local take = math.min(units, c)
    redis.call("ZREM", v.key, got[1])
    if c > take then redis.call("ZADD", v.key, fmt(t), member(t, c - take)) end
    redis.call("ZADD", v.key, fmt(-1 - sat_sub(v.stored_sum, take)), "sum")
    return load(v.key, l, now)
  end

  local function save(key, l, v, now, fresh_at)
    if v.cut_n > 0 then redis.call("ZREMRANGEBYRANK", key, -v.cut_n, -1) end
    if v.cut_part > 0 then
      local top = redis.call("ZREVRANGEBYSCORE", key, "+inf", "0", "LIMIT", 0, 1)
      if #top > 0 then
        local t, c = parse(top[1])
        redis.call("ZREM", key, top[1])
        redis.call("ZADD", key, fmt(t), member(t, c - v.cut_part))
      end
    end
    for _, e in ipairs(v.added) do
      redis.call("ZADD", key, fmt(e[1]), member(e[1], e[2]))
    end
    redis.call("ZADD", key, fmt(-1 - logged(v)), "sum")
    redis.call("PEXPIRE", key, fmt(ttl_ms(now, fresh_at)))
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    nil, save, nil, name_take, give_named)
end
