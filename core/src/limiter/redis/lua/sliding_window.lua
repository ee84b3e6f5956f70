-- sliding_window: mirrors src/limiter/sliding_window.rs. State: "start:current:previous" (the
-- counts of the epoch-aligned window starting at start and of the one before); absent = none.
-- Made only when a request uses it (see MAKERS in the prelude).

MAKERS.s = MAKERS.s and function()
  -- floor(x * y / z) and the remainder, exactly, for 0 <= x <= z <= 2^52 and 0 <= y <= MAX
  -- (the Rust side multiplies in 128 bits): long multiplication over the bits of y, keeping the
  -- running remainder below z, so that no intermediate value reaches 2^53.
  local function mul_div(x, y, z)
    local q, r, bit = 0, 0, 1
    while bit * 2 <= y do bit = bit * 2 end
    while bit >= 1 do
      q = q * 2
      r = r * 2
      if r >= z then r = r - z; q = q + 1 end
      if y >= bit then
        y = y - bit
        r = r + x
        if r >= z then r = r - z; q = q + 1 end
      end
      bit = bit / 2
    end
    return q, r
  end

  local EMPTY = { start = 0, current = 0, previous = 0 }

  local function params(quota, period)
    if period < 1 then period = 1 end
    return { quota = quota, period = period }
  end

  local function load(text)
    local n = load_numbers(text, 3)
    if n == nil then return EMPTY end
    return { start = n[1], current = n[2], previous = n[3] }
  end

  local function rolled(w, c, now)
    local start = div_floor(now, w.period) * w.period
    if c.start >= start then return c end
    if sat_add(c.start, w.period) == start then
      return { start = start, current = 0, previous = c.current }
    end
    return { start = start, current = 0, previous = 0 }
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
    return { start = c.start, current = sat_add(c.current, cost), previous = c.previous }
  end

  local function give(w, c, now, cost)
    if w.quota == 0 or cost == 0 then return c end
    c = rolled(w, c, now)
    local from_current = math.min(cost, c.current)
    local current = c.current - from_current
    local previous = sat_sub(c.previous, cost - from_current)
    if current == 0 and previous == 0 then return EMPTY end
    return { start = c.start, current = current, previous = previous }
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
    return fmt(c.start) .. ":" .. fmt(c.current) .. ":" .. fmt(c.previous)
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    text)
end
