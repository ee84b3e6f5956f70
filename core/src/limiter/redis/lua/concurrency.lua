-- concurrency: mirrors src/limiter/concurrency.rs (docs/holds.md).
--
-- State: a sorted set scored by expiry. Each record is a member "<kind>:<id>:<count>" scored
-- by its expiry, kind "a" for an admitted hold and "d" for a pending denial (a denied
-- request whose release is still to come); the member "n" holds the id of the next record,
-- as the score -1 - id (below every expiry). Absent = no records.
-- An admitted hold a request names (a rule's hold_id) is a record of its own whose id is at
-- least 2^52 (BY_ID), never merged with another.
--
-- A state here is the key's live records read into two lists (admitted, denied), each in
-- expiry order (expired records are dropped as the key is read), and the members stored
-- with their scores; operations return a new state, never modify one. `save` writes only
-- the difference. Made only when a request uses it (see MAKERS in the prelude).

MAKERS.c = MAKERS.c and function()
  local MAX_RECORDS = 10000
  -- Ids of holds a request names (hold_id) are at least this (2^52; concurrency::BY_ID).
  local BY_ID = 4503599627370496

  local function params(quota, period)
    if period < 1 then period = 1 end
    return { slots = quota, lease = period, cap = math.max(math.min(quota, MAX_RECORDS), 1) }
  end

  local function load(key, p, now)
    local v = { a = {}, d = {}, next_id = 0, stored = {} }
    redis.call("ZREMRANGEBYSCORE", key, "0", fmt(now))
    local got = redis.call("ZRANGE", key, 0, -1, "WITHSCORES")
    if #got == 0 then return v end
    if #got == 2 and got[1] == "n" then
      redis.call("DEL", key)
      return v
    end
    for i = 1, #got, 2 do
      local m, score = got[i], tonumber(got[i + 1])
      v.stored[m] = score
      if m == "n" then
        v.next_id = clamp(-1 - score)
      else
        local kind, id, count = string.match(m, "^([ad]):(%d+):(%d+)$")
        if kind then
          local list = v[kind]
          list[#list + 1] = { id = clamp(id), expiry = clamp(score), count = clamp(count) }
        end
      end
    end
    return v
  end

  local function copy_list(list)
    local c = {}
    for i, r in ipairs(list) do c[i] = r end
    return c
  end

  local function copy(v)
    return { a = copy_list(v.a), d = copy_list(v.d), next_id = v.next_id, stored = v.stored }
  end

  -- Every record of a state is live at its `now` (one `now` per call).
  local function sum(list)
    local s = 0
    for _, r in ipairs(list) do s = sat_add(s, r.count) end
    return s
  end

  local function admits(p, v, now, cost)
    return count_admits(p.slots, sum(v.a), cost)
  end

  local function record(p, v, now, cost, kind, cap)
    v = copy(v)
    local list = v[kind]
    local expiry = sat_add(now, p.lease)
    local back = list[#list]
    -- a request's named hold is never merged with others (its id frees exactly it)
    if back and ((back.expiry >= expiry and back.id < BY_ID) or #list >= cap) then
      list[#list] = { id = back.id, expiry = math.max(back.expiry, expiry),
                      count = sat_add(back.count, cost) }
    else
      if back and back.expiry > expiry then expiry = back.expiry end
      list[#list + 1] = { id = v.next_id, expiry = expiry, count = cost }
      v.next_id = v.next_id + 1
    end
    return v
  end

  local function take(p, v, now, cost)
    if p.slots == 0 or cost == 0 then return v end
    return record(p, v, now, cost, "a", p.cap)
  end

  local function deny(p, v, now, cost)
    if cost == 0 then return v end
    return record(p, v, now, cost, "d", MAX_RECORDS)
  end

  -- Takes up to `cost` from the front of `list` (in place), passing over the holds requests
  -- name (ids from BY_ID: only a release naming them frees them); what was not there to take.
  local function release(list, cost)
    local at = 1
    while cost > 0 and at <= #list do
      local f = list[at]
      if f.id >= BY_ID then
        at = at + 1
      else
        local t = math.min(cost, f.count)
        cost = cost - t
        if t == f.count then
          table.remove(list, at)
        else
          list[at] = { id = f.id, expiry = f.expiry, count = f.count - t }
        end
      end
    end
    return cost
  end

  local function give(p, v, now, cost)
    v = copy(v)
    release(v.a, release(v.d, cost))
    return v
  end

  -- Holds a request names (mirrors Concurrency::take_id, give_back_id): an admitted cost
  -- under `id`, added to that hold when it is live (moved to the back, with the new expiry);
  -- a release frees up to `cost` of that hold only, nothing when it is not held.
  local function take_id(p, v, now, cost, id)
    if p.slots == 0 or cost == 0 then return v end
    v = copy(v)
    local held = 0
    for i, r in ipairs(v.a) do
      if r.id == id then
        held = r.count
        table.remove(v.a, i)
        break
      end
    end
    local expiry = sat_add(now, p.lease)
    local back = v.a[#v.a]
    if back and back.expiry > expiry then expiry = back.expiry end
    v.a[#v.a + 1] = { id = id, expiry = expiry, count = sat_add(held, cost) }
    return v
  end

  local function give_id(p, v, now, cost, id)
    for i, r in ipairs(v.a) do
      if r.id == id then
        v = copy(v)
        if r.count <= cost then
          table.remove(v.a, i)
        else
          v.a[i] = { id = r.id, expiry = r.expiry, count = r.count - cost }
        end
        return v
      end
    end
    return v
  end

  local function remaining(p, v, now)
    return sat_sub(p.slots, sum(v.a))
  end

  local function reset(p, v, now)
    local back = v.a[#v.a]
    if back == nil then return 0 end
    return sat_sub(back.expiry, now)
  end

  local function until_admitted(p, v, now, cost)
    if p.slots == 0 or cost > p.slots then return p.lease end
    local need = sat_sub(sat_add(sum(v.a), cost), p.slots)
    if need == 0 then return 1 end
    local freed = 0
    for _, r in ipairs(v.a) do
      freed = sat_add(freed, r.count)
      if freed >= need then return math.max(sat_sub(r.expiry, now), 1) end
    end
    return p.lease
  end

  local function fresh_at(p, v, now)
    local wait = reset(p, v, now)
    local back = v.d[#v.d]
    if back ~= nil then wait = math.max(wait, sat_sub(back.expiry, now)) end
    return fresh_after(now, wait)
  end

  -- Writes the difference: ZREM the members gone, ZADD the new or moved ones, and the id.
  local function save(key, p, v, now, fresh_at)
    local keep, add = { n = true }, {}
    for _, kind in ipairs({ "a", "d" }) do
      for _, r in ipairs(v[kind]) do
        local m = kind .. ":" .. fmt(r.id) .. ":" .. fmt(r.count)
        keep[m] = true
        if v.stored[m] ~= r.expiry then
          add[#add + 1] = fmt(r.expiry)
          add[#add + 1] = m
        end
      end
    end
    local gone = {}
    for m in pairs(v.stored) do
      if not keep[m] then gone[#gone + 1] = m end
    end
    for from = 1, #gone, MGET_KEYS do
      redis.call("ZREM", key, unpack(gone, from, math.min(from + MGET_KEYS - 1, #gone)))
    end
    for from = 1, #add, 2 * MGET_KEYS do
      redis.call("ZADD", key, unpack(add, from, math.min(from + 2 * MGET_KEYS - 1, #add)))
    end
    redis.call("ZADD", key, fmt(-1 - v.next_id), "n")
    redis.call("PEXPIRE", key, fmt(ttl_ms(now, fresh_at)))
  end

  -- A reservation on holds: its commit releases by name as an anonymous release does.
  local function name_take(p, v, now) return v, 0 end
  local function give_named(p, v, now, units) return give(p, v, now, units) end
  local algo = algorithm(params, load, admits, take, give, remaining, reset, until_admitted,
    fresh_at, nil, save, deny, name_take, give_named)
  algo.take_id, algo.give_id = take_id, give_id
  return algo
end
