-- reserve: one operation on a key's reservations (the Throttle API's Reserve and Commit),
-- mirroring core/src/limiter/memory/reserve.rs and core/src/limiter/reserve.rs. Its own
-- script (src/limiter/redis/reserve.rs): the batch script with main.lua as the function
-- decide_batch(KEYS, ARGV), then this. One call decides the rate state and the records.
--
-- KEYS[1..n-2]  the batch's KEYS (prelude.lua's contract)
-- KEYS[n]       the reserved key's lease records (KEYS[s] .. LEASE_SUFFIX of its state key):
--               while a lease on a funnel key is out, a commit gives nothing back by name.
--               A lease's units are scheduled behind the reservation's, and a return moves
--               every later unit's slot earlier; a leased unit may be spent up to its lease's
--               end, and moved earlier its slot could drain before it is spent. The units are
--               lost (counted as used): never over the bound.
-- KEYS[n-1]     the key's open reservations: a hash, field "n" the next id, field "<id>"
--               "<amount>:<expiry>:<mark>" (expiry in microseconds; mark: where the amount
--               was counted, the algorithm's name_take); its TTL reaches the latest expiry,
--               and it is deleted when no reservation is open (its next id with it). A record
--               of the older "<amount>:<expiry>" has no mark: its commit gives back as an
--               anonymous refund does.
-- ARGV[1..m-4]  the batch's ARGV (prelude.lua's contract: ARGV[1] is also this script's now);
--               reserve: a request whose first hit takes the amount; commit: a request of
--               one hit of cost 0, whose cost and refund flag are set here to settle, then
--               any others (a check of what the key holds after it)
-- ARGV[m-3]     the operation: "r" reserve, "c" commit
-- ARGV[m-2]     reserve: the amount; commit: the reservation's id (decimal)
-- ARGV[m-1]     reserve: the ttl in microseconds; commit: the actual amount
-- ARGV[m]       the most reservations open at once on a key
--
-- Reply: { status, id, estimate, open, batch reply }: status 1 done (reserved; settled), 0
-- not (refused by the limit; unknown, committed or expired id), 2 a reserve refused because
-- `max` reservations are open (the batch did not run: its reply is ""); id the reservation's
-- (reserve); estimate its amount (commit); open the reservations open after the call.

floor, format = math.floor, string.format

local nk, na = #KEYS, #ARGV
local records, leases = KEYS[nk - 1], KEYS[nk]
local batch_keys, batch_argv = {}, {}
for i = 1, nk - 2 do batch_keys[i] = KEYS[i] end
for i = 1, na - 4 do batch_argv[i] = ARGV[i] end
local op, arg, arg2, max_open = ARGV[na - 3], ARGV[na - 2], clamp(ARGV[na - 1]),
  clamp(ARGV[na])

local now = clock(ARGV[1])

-- The algorithm and parameters of the batch's limit `l` (main.lua parses them so too).
local function limit_of(l)
  local at = 7 * l - 4
  local make = MAKERS[batch_argv[at]]
  if type(make) ~= "function" then return nil end
  local algo = make()
  local flags = tonumber(batch_argv[at + 4]) or 0
  local p = algo.params(clamp(batch_argv[at + 1]), clamp(batch_argv[at + 2]),
                        clamp(batch_argv[at + 3]), flags % 2 == 1)
  local window = batch_argv[at + 6]
  if window ~= nil and window ~= "" then
    local a, b, c, d = string.match(window, "^(%d+),(%d+),(%d+),(%d+)$")
    if a then
      p.cal_previous, p.cal_start, p.cal_end, p.cal_next = tonumber(a), tonumber(b),
        tonumber(c), tonumber(d)
    end
  end
  return algo, p
end

-- The state key, algorithm and parameters of the first hit of the batch's first request.
local function first_hit()
  local blob = batch_argv[#batch_argv]
  local _, _, pos = struct.unpack(REQUEST_FORMAT, blob, 1)
  local slot, limit, cost = struct.unpack(HIT_FORMAT, blob, pos)
  local algo, p = limit_of(limit)
  return batch_keys[slot], algo, p, cost, batch_argv[7 * limit - 4]
end

-- Applies `change(algo, p, state)` (which returns the new state and a value) to the state of
-- `key`, stores the result as main.lua would, and returns the value.
local function update(key, algo, p, change)
  local state
  if algo.text then
    state = algo.load(redis.call("GET", key))
  else
    state = algo.load(key, p, now)
  end
  local after, value = change(state)
  if after ~= state then
    local at = algo.fresh_at(p, after, now)
    if algo.text and at then
      redis.call("SET", key, algo.text(p, after), "PX", format("%d", ttl_ms(now, at)))
    elseif at then
      algo.save(key, p, after, now, at)
    else
      redis.call("DEL", key)
    end
  end
  return value
end

-- The live records (amount, expiry and mark per id), the expired ones deleted.
local next_id, live, count, gone = 0, {}, 0, {}
local flat = redis.call("HGETALL", records)
for i = 1, #flat, 2 do
  local field, value = flat[i], flat[i + 1]
  if field == "n" then
    next_id = clamp(value)
  else
    local amount, expiry, mark = string.match(value, "^(%d+):(%d+):?(%d*)$")
    expiry = tonumber(expiry)
    if expiry == nil or expiry <= now then
      gone[#gone + 1] = field
    else
      live[field] = { clamp(amount), expiry, tonumber(mark) }
      count = count + 1
    end
  end
end
if #gone > 0 then redis.call("HDEL", records, unpack(gone)) end

local status, id, estimate, reply = 0, 0, 0, ""
if op == "r" then
  if count >= max_open then return { 2, 0, 0, count, "" } end
  reply = decide_batch(batch_keys, batch_argv)
  if type(reply) ~= "string" then return reply end
  if struct.unpack("<d", reply, 1) == 1 then
    local key, algo, p, cost = first_hit()
    if algo == nil then return redis.error_reply("sluice: a reservation names no limit") end
    -- The units the other open reservations may still give back (Funnel::reservation_mark).
    local open_units = 0
    for _, record in pairs(live) do open_units = open_units + record[1] end
    local mark = update(key, algo, p, function(state)
      return algo.name_take(p, state, now, cost, open_units)
    end)
    id = math.max(next_id, floor(now))
    local expiry = sat_add(now, arg2)
    live[fmt(id)] = { clamp(arg), expiry, mark }
    count = count + 1
    redis.call("HSET", records, "n", fmt(id + 1), fmt(id),
      fmt(clamp(arg)) .. ":" .. fmt(expiry) .. ":" .. fmt(mark))
    status = 1
  end
elseif op == "c" then
  local cost, role = 0, 0
  local open = live[arg]
  if open then
    estimate = open[1]
    live[arg] = nil
    count = count - 1
    redis.call("HDEL", records, arg)
    if arg2 < estimate then
      -- returned by name (only what still counts of the reservation's units), then reported
      -- by a refund of 0; a record without a mark gives back as an anonymous refund
      cost, role = estimate - arg2, 8
      local mark = open[3]
      if mark then
        local key, algo, p, _, code = first_hit()
        if algo == nil then return redis.error_reply("sluice: a commit names no limit") end
        local units = cost
        -- A funnel's lease out on the key: nothing given back (see KEYS[n] above).
        if code ~= "f" or redis.call("EXISTS", leases) == 0 then
          update(key, algo, p, function(state)
            return algo.give_named(p, state, now, units, mark)
          end)
        end
        cost = 0
      end
    else
      cost = arg2 - estimate
    end
    status = 1
  end
  local blob = batch_argv[#batch_argv]
  local mode, hits, pos = struct.unpack(REQUEST_FORMAT, blob, 1)
  local slot, limit, _, group = struct.unpack(HIT_FORMAT, blob, pos)
  if hits ~= 1 then return redis.error_reply("sluice: a commit settles one hit") end
  batch_argv[#batch_argv] = struct.pack(REQUEST_FORMAT, mode, 1) ..
    struct.pack(HIT_FORMAT, slot, limit, cost, group, role) ..
    string.sub(blob, REQUEST_BYTES + HIT_BYTES + 1)
  reply = decide_batch(batch_keys, batch_argv)
  if type(reply) ~= "string" then return reply end
else
  return redis.error_reply("sluice: unknown reservation operation " .. tostring(op))
end

if count == 0 then
  redis.call("DEL", records)
else
  local latest = 0
  for _, r in pairs(live) do
    if r[2] > latest then latest = r[2] end
  end
  redis.call("PEXPIRE", records, format("%d", ttl_ms(now, latest)))
end
return { status, id, estimate, count, reply }
