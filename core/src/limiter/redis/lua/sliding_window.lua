-- sliding_window: mirrors src/limiter/sliding_window.rs. State:
-- start, current, previous, refundable, packed (pack_state in the prelude: the counts of the
-- epoch-aligned window starting at start and of the one before, and how many of the current
-- one anonymous refunds may give back); absent = none. The older text formats
-- "start:current:previous:refundable" and "start:current:previous" (nothing refundable) are
-- still read.
-- Made only when a request uses it (see MAKERS in the prelude).

MAKERS.s = MAKERS.s and function()
  local EMPTY = { start = 0, current = 0, previous = 0, refundable = 0 }

  local function params(quota, period)
    if period < 1 then period = 1 end
    return { quota = quota, period = period }
  end

  local function load(text)
    local n = load_fields(text, 3)
    if n == nil then return EMPTY end
    return { start = n[1], current = n[2], previous = n[3], refundable = n[4] }
  end

  local function rolled(w, c, now)
    local start = div_floor(now, w.period) * w.period
    if c.start >= start then return c end
    if sat_add(c.start, w.period) == start then
      return { start = start, current = 0, previous = c.current, refundable = 0 }
    end
    return { start = start, current = 0, previous = 0, refundable = 0 }
  end

  local function estimate(w, c, now)
    c = rolled(w, c, now)
    local left = sat_sub(w.period, sat_sub(now, c.start))
    local weighted = mul_div(left, c.previous, w.period)
    return sat_add(c.current, weighted)
  end

  local function admits(w, c, now, cost)
    return count_admits(w.quota, estimate(w, c, now), cost)
  end

  local function take(w, c, now, cost)
    if w.quota == 0 or cost == 0 then return c end
    c = rolled(w, c, now)
    return { start = c.start, current = sat_add(c.current, cost), previous = c.previous,
             refundable = sat_add(c.refundable, cost) }
  end

  -- SlidingWindow::settled
  local function settled(c, current, previous)
    if current == 0 and previous == 0 then return EMPTY end
    return { start = c.start, current = current, previous = previous,
             refundable = math.min(c.refundable, current) }
  end

  -- An anonymous refund: from the current window's count only, at most its refundable units.
  local function give(w, c, now, cost)
    if w.quota == 0 or cost == 0 then return c end
    c = rolled(w, c, now)
    local back = math.min(cost, c.refundable)
    local refunded = { start = c.start, current = c.current, previous = c.previous,
                       refundable = c.refundable - back }
    return settled(refunded, sat_sub(c.current, back), c.previous)
  end

  -- SlidingWindow::name_take and mark: the window's start; nothing counted so far refundable.
  local function name_take(w, c, now)
    local mark = div_floor(now, w.period) * w.period
    local r = rolled(w, c, now)
    if r.current == 0 then return c, mark end
    return { start = r.start, current = r.current, previous = r.previous, refundable = 0 }, mark
  end

  -- SlidingWindow::return_units: to the window counted in, or the previous count once it has
  -- rolled, and to nothing after that.
  local function give_named(w, c, now, units, start)
    if w.quota == 0 or units == 0 then return c end
    local r = rolled(w, c, now)
    if r.start == start then return settled(r, sat_sub(r.current, units), r.previous) end
    if r.start == sat_add(start, w.period) then
      return settled(r, r.current, sat_sub(r.previous, units))
    end
    return c
  end

  local function remaining(w, c, now)
    if w.quota == 0 then return 0 end
    return sat_sub(w.quota, estimate(w, c, now))
  end

  local function weightless_from(w, count)
    return w.period - div_floor(w.period - 1, math.max(count, 1))
  end

  local function reset(w, c, now)
    c = rolled(w, c, now)
    local at
    if c.current > 0 then
      at = sat_add(sat_add(c.start, w.period), weightless_from(w, c.current))
    elseif c.previous > 0 then
      at = sat_add(c.start, weightless_from(w, c.previous))
    else
      return 0
    end
    return sat_sub(at, now)
  end

  -- The first offset into a window at which a previous count weighs at most allowed, or nil.
  local function decayed_at(w, count, allowed)
    if count <= allowed then return nil end
    local q, r = mul_div(allowed + 1, w.period, count)
    if r > 0 then q = q + 1 end
    return w.period - (q - 1)
  end

  local function until_admitted(w, c, now, cost)
    if w.quota == 0 or cost > w.quota then
      return math.max(reset(w, c, now), w.period)
    end
    c = rolled(w, c, now)
    local room = w.quota - cost
    local at
    if c.current <= room then
      local offset = decayed_at(w, c.previous, room - c.current)
      if offset == nil then at = now else at = sat_add(c.start, offset) end
    else
      local offset = decayed_at(w, c.current, room) or 0
      at = sat_add(sat_add(c.start, w.period), offset)
    end
    return math.max(sat_sub(at, now), 1)
  end

  local function fresh_at(w, c, now)
    return fresh_after(now, reset(w, c, now))
  end

  local function text(w, c)
    return pack_state(c.start, c.current, c.previous, c.refundable)
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    text, nil, nil, name_take, give_named)
end
