-- funnel: mirrors src/limiter/funnel.rs. State: the tat, one decimal integer ("0" = fresh).
-- Made only when a request uses it (see MAKERS in the prelude). main.lua's fast path writes
-- out admits, take, remaining and reset for the requests it decides: a change here is made
-- there too (its take has Funnel::take's cap).

MAKERS.f = MAKERS.f and function()
  -- Funnel::new
  local function params(quota, period, burst, borrow)
    if period < 1 then period = 1 end
    local interval = 0
    if quota > 0 then
      interval = div_ceil(period, quota)
      if interval < 1 then interval = 1 end
    end
    return { interval = interval, tolerance = sat_mul(interval, burst), period = period,
             borrow = borrow }
  end

  local function load(text)
    return clamp(text or "0")
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

  local function admits(f, tat, now, cost)
    if f.interval == 0 then return cost == 0 end
    local probe = cost
    if f.borrow then probe = math.min(cost, 1) end
    return funnel_consume(f, tat, now, probe) - now <= f.tolerance
  end

  -- Funnel::take: consume, but never past debt_cap (now + tolerance + period) nor behind tat.
  local function take(f, tat, now, cost)
    local next = funnel_consume(f, tat, now, cost)
    local cap = sat_add(sat_add(now, f.tolerance), f.period)
    if cap < tat then cap = tat end
    if next > cap then return cap end
    return next
  end

  local function give(f, tat, now, cost)
    if f.interval == 0 then return tat end
    local back = sat_sub(tat, sat_mul(cost, f.interval))
    if back <= now then return 0 end
    return back
  end

  local function remaining(f, tat, now)
    if f.interval == 0 then return 0 end
    local ahead = tat - now
    if ahead <= 0 then return div_floor(f.tolerance, f.interval) end
    if ahead >= f.tolerance then return 0 end
    return div_floor(f.tolerance - ahead, f.interval)
  end

  local function reset(f, tat, now)
    if tat > now then return tat - now end
    return 0
  end

  local function until_admitted(f, tat, now, cost)
    if f.interval == 0 then return f.period end
    local probe = cost
    if f.borrow then probe = math.min(cost, 1) end
    local wait
    if sat_mul(probe, f.interval) > f.tolerance then
      wait = math.max(sat_sub(tat, now), f.period)
    else
      wait = sat_sub(sat_sub(funnel_consume(f, tat, now, probe), now), f.tolerance)
    end
    return math.max(wait, 1)
  end

  local function fresh_at(f, tat, now)
    if tat > now then return tat end
    return nil
  end

  local function text(f, tat)
    return fmt(tat)
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    text)
end
