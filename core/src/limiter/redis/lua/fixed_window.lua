-- fixed_window: mirrors src/limiter/fixed_window.rs. State: "start:count" (the count of the
-- window starting at start: epoch-aligned, or a calendar window whose bounds main.lua put in
-- the parameters as cal_previous, cal_start, cal_end, cal_next); absent = nothing counted.
-- Made only when a request uses it (see MAKERS in the prelude).

MAKERS.w = MAKERS.w and function()
  local WINDOW_EMPTY = { start = 0, count = 0 }

  local function params(quota, period)
    if period < 1 then period = 1 end
    return { quota = quota, period = period }
  end

  local function load(text)
    local n = load_numbers(text, 2)
    if n == nil then return WINDOW_EMPTY end
    return { start = n[1], count = n[2] }
  end

  -- The window holding now: its start and end. A calendar window is the one of the three
  -- sluice sent that holds now (the nearest one should now be outside them all).
  local function window(w, now)
    if w.cal_start == nil then
      local start = div_floor(now, w.period) * w.period
      return start, sat_add(start, w.period)
    end
    if now >= w.cal_end then return w.cal_end, w.cal_next end
    if now < w.cal_start then return w.cal_previous, w.cal_start end
    return w.cal_start, w.cal_end
  end

  local function window_start(w, now)
    local start = window(w, now)
    return start
  end

  local function window_count(w, s, now)
    if s.start == window_start(w, now) then return s.count end
    return 0
  end

  local function admits(w, s, now, cost)
    return count_admits(w.quota, window_count(w, s, now), cost)
  end

  local function take(w, s, now, cost)
    if w.quota == 0 or cost == 0 then return s end
    return { start = window_start(w, now), count = sat_add(window_count(w, s, now), cost) }
  end

  local function give(w, s, now, cost)
    if w.quota == 0 or cost == 0 then return s end
    local count = sat_sub(window_count(w, s, now), cost)
    if count == 0 then return WINDOW_EMPTY end
    return { start = window_start(w, now), count = count }
  end

  -- FixedWindow::mark: the window's start.
  local function name_take(w, s, now)
    return s, window_start(w, now)
  end

  -- FixedWindow::return_units: only while the window counted in is the current one.
  local function give_named(w, s, now, units, start)
    if window_start(w, now) ~= start or s.start ~= start then return s end
    return give(w, s, now, units)
  end

  local function remaining(w, s, now)
    return sat_sub(w.quota, window_count(w, s, now))
  end

  -- To the end of the window holding now: the reset reported, as envoyproxy/ratelimit does.
  local function reset(w, s, now)
    local _, stop = window(w, now)
    return math.max(sat_sub(stop, now), 1)
  end

  local function until_admitted(w, s, now, cost)
    if w.quota == 0 or cost > w.quota then return reset(w, s, now) end
    if admits(w, s, now, cost) then return 1 end
    return reset(w, s, now)
  end

  local function fresh_at(w, s, now)
    if window_count(w, s, now) == 0 then return nil end
    return sat_add(now, reset(w, s, now))
  end

  local function text(w, s)
    return fmt(s.start) .. ":" .. fmt(s.count)
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    text, nil, nil, name_take, give_named)
end
