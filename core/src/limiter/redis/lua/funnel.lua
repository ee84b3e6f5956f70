-- funnel: mirrors src/limiter/funnel.rs. State: tat, quota, refundable, packed (pack_state in
-- the prelude; Tat: the tat, the quota it was taken under, the units anonymous refunds may
-- still give back), absent = fresh. The older text formats are still read: "tat:quota:refundable",
-- and the tat alone ("<tat>"), as taken under the current quota, with nothing refundable. A state taken under another quota is read at the new interval, its units
-- kept (Funnel::tat_of). Made only when a request uses it (see MAKERS in the prelude).
-- main.lua's fast path writes out admits, take, remaining and reset for the requests it
-- decides: a change here is made there too (its take has Funnel::take's cap).

MAKERS.f = MAKERS.f and function()
  local U32 = 4294967295
  local FRESH = { tat = 0, quota = 0, refundable = 0 }

  local function interval_of(period, quota)
    if quota <= 0 then return 0 end
    local interval = div_ceil(period, quota)
    if interval < 1 then interval = 1 end
    return interval
  end

  -- Funnel::new
  local function params(quota, period, burst, borrow)
    if period < 1 then period = 1 end
    local interval = interval_of(period, quota)
    return { quota = quota, interval = interval, tolerance = sat_mul(interval, burst),
             period = period, borrow = borrow }
  end

  local function load(text)
    if not text then return FRESH end
    if #text == 25 and string.byte(text, 1) == STATE_MARK then
      local _, t, q, r = struct.unpack("<Bddd", text)
      return { tat = clamp_number(t), quota = clamp_number(q), refundable = clamp_number(r) }
    end
    local a, b, c = string.match(text, "^(%d+):(%d+):(%d+)$")
    if a == nil then return { tat = clamp(text), quota = 0, refundable = 0 } end
    return { tat = clamp(a), quota = clamp(b), refundable = clamp(c) }
  end

  -- Funnel::tat_of: the level of a state taken under another quota, scaled to this interval
  -- and rounded up: ceil(level * T / T_old) = a * T + ceil(b * T / T_old), level = a * T_old + b.
  local function tat_of(f, s, now)
    if s.quota == 0 or s.quota == f.quota or f.interval == 0 or s.tat <= now then
      return s.tat
    end
    local old = interval_of(f.period, s.quota)
    local level = s.tat - now
    local a = div_floor(level, old)
    local q, r = mul_div(level - a * old, f.interval, old)
    if r > 0 then q = q + 1 end
    return sat_add(now, sat_add(sat_mul(a, f.interval), q))
  end

  local function refundable(s, now)
    if s.tat <= now then return 0 end
    return s.refundable
  end

  -- The hot path: sat_add(max(tat, now), sat_mul(cost, interval)) without the calls (a product
  -- above MAX, exact or not, makes the sum above MAX too).
  local function funnel_consume(f, tat, now, cost)
    if f.interval == 0 or cost == 0 then return tat end
    if tat < now then tat = now end
    local sum = tat + cost * f.interval
    if sum > MAX then return MAX end
    return sum
  end

  local function admits(f, s, now, cost)
    if f.interval == 0 then return cost == 0 end
    local probe = cost
    if f.borrow then probe = math.min(cost, 1) end
    return funnel_consume(f, tat_of(f, s, now), now, probe) - now <= f.tolerance
  end

  -- Funnel::take_state: consume, but never past debt_cap (now + tolerance + period) nor behind
  -- tat; the cost becomes refundable.
  local function take(f, s, now, cost)
    if f.interval == 0 or cost == 0 then return s end
    local tat = tat_of(f, s, now)
    local next = funnel_consume(f, tat, now, cost)
    local cap = sat_add(sat_add(now, f.tolerance), f.period)
    if cap < tat then cap = tat end
    if next > cap then next = cap end
    local back = refundable(s, now) + math.min(cost, U32)
    if back > U32 then back = U32 end
    return { tat = next, quota = f.quota, refundable = back }
  end

  -- Funnel::refund_state: an anonymous refund gives back at most the refundable units.
  local function give(f, s, now, cost)
    if f.interval == 0 or cost == 0 then return s end
    local left = refundable(s, now)
    local units = math.min(cost, left)
    local back = sat_sub(tat_of(f, s, now), sat_mul(units, f.interval))
    if back <= now then return FRESH end
    return { tat = back, quota = f.quota, refundable = left - units }
  end

  -- Funnel::name_take: the slots' end is the mark; nothing taken so far is refundable. With
  -- a reservation's cost and the units of the other open reservations on the key
  -- (Algo::name_reservation), the mark is Funnel::reservation_mark: the earliest the slots
  -- can come to end once those give back what was ahead of them, and never before they
  -- would in an empty funnel.
  local function name_take(f, s, now, cost, open)
    if f.interval == 0 or s.tat == 0 then return s, 0 end
    local tat = tat_of(f, s, now)
    local mark = tat
    if cost then
      local front = sat_add(now, sat_mul(cost, f.interval))
      local moved = sat_sub(tat, sat_mul(open or 0, f.interval))
      mark = math.min(math.max(front, moved), tat)
    end
    return { tat = tat, quota = f.quota, refundable = 0 }, mark
  end

  -- Funnel::return_units: only the units whose slots are still wholly ahead of now.
  local function give_named(f, s, now, units, slots_end)
    if f.interval == 0 or units == 0 then return s end
    local ahead = div_floor(sat_sub(slots_end, now), f.interval)
    local back = sat_sub(tat_of(f, s, now), sat_mul(math.min(units, ahead), f.interval))
    if back <= now then return FRESH end
    return { tat = back, quota = f.quota, refundable = refundable(s, now) }
  end

  local function remaining(f, s, now)
    if f.interval == 0 then return 0 end
    local ahead = tat_of(f, s, now) - now
    if ahead <= 0 then return div_floor(f.tolerance, f.interval) end
    if ahead >= f.tolerance then return 0 end
    return div_floor(f.tolerance - ahead, f.interval)
  end

  local function reset(f, s, now)
    local tat = tat_of(f, s, now)
    if tat > now then return tat - now end
    return 0
  end

  -- Funnel::until_admitted_state: exact also for a state taken under another quota, whose
  -- level drains at its own rate until a write converts it: the cost fits once
  -- tat - t <= floor(room * T_old / T), room = tolerance - cost * T, computed as
  -- a * T_old + floor(b * T_old / T) for room = a * T + b.
  local function until_admitted(f, s, now, cost)
    if f.interval == 0 then return f.period end
    local probe = cost
    if f.borrow then probe = math.min(cost, 1) end
    local need = sat_mul(probe, f.interval)
    local converts = s.quota ~= 0 and s.quota ~= f.quota and s.tat > now
    if converts and need <= f.tolerance then
      local old = interval_of(f.period, s.quota)
      local room = f.tolerance - need
      local a = div_floor(room, f.interval)
      local q = mul_div(room - a * f.interval, old, f.interval)
      local slack = sat_add(sat_mul(a, old), q)
      return math.max(sat_sub(sat_sub(s.tat, slack), now), 1)
    end
    local wait
    if need > f.tolerance then
      -- until empty: the stored tat, converted or not
      wait = math.max(sat_sub(s.tat, now), f.period)
    else
      wait = sat_sub(sat_sub(funnel_consume(f, s.tat, now, probe), now), f.tolerance)
    end
    return math.max(wait, 1)
  end

  local function fresh_at(f, s, now)
    local tat = tat_of(f, s, now)
    if tat > now then return tat end
    return nil
  end

  local function text(f, s)
    return pack_state(s.tat, s.quota, s.refundable)
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    text, nil, nil, name_take, give_named)
end
