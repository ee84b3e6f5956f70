-- fixed_window: mirrors src/limiter/fixed_window.rs. State: start, count, refundable, packed
-- (pack_state in the prelude: the count of the window starting at start: epoch-aligned, or a
-- calendar window whose bounds main.lua put in the parameters as cal_previous, cal_start,
-- cal_end, cal_next; and how many of it anonymous refunds may give back); absent = nothing
-- counted. The older text formats "start:count:refundable" and "start:count" (nothing
-- refundable) are still read.
-- Made only when a request uses it (see MAKERS in the prelude).

MAKERS.w = MAKERS.w and function()
  local WINDOW_EMPTY = { start = 0, count = 0, refundable = 0 }

  local function params(quota, period)
    if period < 1 then period = 1 end
    return { quota = quota, period = period }
  end

  local function load(text)
    local n = load_fields(text, 2)
    if n == nil then return WINDOW_EMPTY end
    return { start = n[1], count = n[2], refundable = n[3] }
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

  -- FixedWindow::current: the state if it is the window holding now, else nothing counted.
  local function current(w, s, now)
    if s.start == window_start(w, now) then return s end
    return WINDOW_EMPTY
  end

  -- FixedWindow::counted
  local function counted(w, now, count, refundable)
    if count == 0 then return WINDOW_EMPTY end
    return { start = window_start(w, now), count = count,
             refundable = math.min(refundable, count) }
  end

  local function admits(w, s, now, cost)
    return count_admits(w.quota, window_count(w, s, now), cost)
  end

  local function take(w, s, now, cost)
    if w.quota == 0 or cost == 0 then return s end
    local at = current(w, s, now)
    return { start = window_start(w, now), count = sat_add(at.count, cost),
             refundable = sat_add(at.refundable, cost) }
  end

  -- An anonymous refund: from the current window, at most its refundable units.
  local function give(w, s, now, cost)
    if w.quota == 0 or cost == 0 then return s end
    local at = current(w, s, now)
    local back = math.min(cost, at.refundable)
    return counted(w, now, at.count - math.min(back, at.count), at.refundable - back)
  end

  -- FixedWindow::name_take and mark: the window's start; nothing counted so far refundable.
  local function name_take(w, s, now)
    local at = current(w, s, now)
    if at.count == 0 then return s, window_start(w, now) end
    return { start = at.start, count = at.count, refundable = 0 }, window_start(w, now)
  end

  -- FixedWindow::return_units: only while the window counted in is the current one.
  local function give_named(w, s, now, units, start)
    if w.quota == 0 or window_start(w, now) ~= start or s.start ~= start then return s end
    return counted(w, now, sat_sub(s.count, units), s.refundable)
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
    return pack_state(s.start, s.count, s.refundable)
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    text, nil, nil, name_take, give_named)
end
