-- token_bucket: mirrors src/limiter/token_bucket.rs. State: used, anchor, refundable, packed
-- (pack_state in the prelude: tokens missing from a full bucket, as of the refill step at
-- anchor, and how many of them anonymous refunds may give back); absent = full. The older
-- text formats "used:anchor:refundable" and "used:anchor" (nothing refundable) are still read.
-- Made only when a request uses it (see MAKERS in the prelude).

MAKERS.b = MAKERS.b and function()
  local BUCKET_FULL = { used = 0, anchor = 0, refundable = 0 }

  local function params(quota, period, burst, borrow)
    if period < 1 then period = 1 end
    return { quota = quota, period = period, burst = burst, borrow = borrow }
  end

  local function load(text)
    local n = load_fields(text, 2)
    if n == nil then return BUCKET_FULL end
    return { used = n[1], anchor = n[2], refundable = n[3] }
  end

  local function bucket_refilled(b, s, now)
    if s.used == 0 then return BUCKET_FULL end
    local steps = div_floor(sat_sub(now, s.anchor), b.period)
    if steps == 0 then return s end
    local used = sat_sub(s.used, sat_mul(steps, b.quota))
    if used == 0 then return BUCKET_FULL end
    return { used = used, anchor = sat_add(s.anchor, sat_mul(steps, b.period)), refundable = 0 }
  end

  -- TokenBucket::settled
  local function settled(at, used, refundable)
    if used == 0 then return BUCKET_FULL end
    return { used = used, anchor = at.anchor, refundable = math.min(refundable, used) }
  end

  local function bucket_probe(b, cost)
    if b.borrow then return math.min(cost, 1) end
    return cost
  end

  local function admits(b, s, now, cost)
    if b.quota == 0 then return cost == 0 end
    return sat_add(bucket_refilled(b, s, now).used, bucket_probe(b, cost)) <= b.burst
  end

  local function take(b, s, now, cost)
    if b.quota == 0 or cost == 0 then return s end
    local at = bucket_refilled(b, s, now)
    local anchor = at.anchor
    if at.used == 0 then anchor = now end
    -- TokenBucket::consume's cap: never more than burst + quota missing (nor more than before).
    local used, cap = sat_add(at.used, cost), sat_add(b.burst, b.quota)
    if cap < at.used then cap = at.used end
    if used > cap then used = cap end
    return { used = used, anchor = anchor, refundable = sat_add(at.refundable, cost) }
  end

  -- An anonymous refund: at most the refundable tokens of the current refill step.
  local function give(b, s, now, cost)
    if b.quota == 0 or cost == 0 then return s end
    local at = bucket_refilled(b, s, now)
    local back = math.min(cost, at.refundable)
    return settled(at, sat_sub(at.used, back), at.refundable - back)
  end

  -- TokenBucket::name_take and mark: the refill step the take counted in; nothing taken so
  -- far refundable.
  local function name_take(b, s, now)
    local at = bucket_refilled(b, s, now)
    if at.used == 0 then return s, at.anchor end
    return { used = at.used, anchor = at.anchor, refundable = 0 }, at.anchor
  end

  -- TokenBucket::return_units: only while that refill step is the current one.
  local function give_named(b, s, now, units, anchor)
    local at = bucket_refilled(b, s, now)
    if b.quota == 0 or units == 0 or at.used == 0 or at.anchor ~= anchor then return s end
    return settled(at, sat_sub(at.used, units), at.refundable)
  end

  local function remaining(b, s, now)
    if b.quota == 0 then return 0 end
    return sat_sub(b.burst, bucket_refilled(b, s, now).used)
  end

  local function bucket_refill_time(b, at, missing, now)
    local steps = div_ceil(missing, b.quota)
    return sat_sub(sat_add(at.anchor, sat_mul(steps, b.period)), now)
  end

  local function reset(b, s, now)
    local at = bucket_refilled(b, s, now)
    if b.quota == 0 or at.used == 0 then return 0 end
    return bucket_refill_time(b, at, at.used, now)
  end

  local function until_admitted(b, s, now, cost)
    if b.quota == 0 then return b.period end
    local probe = bucket_probe(b, cost)
    local wait
    if probe > b.burst then
      wait = math.max(reset(b, s, now), b.period)
    else
      local at = bucket_refilled(b, s, now)
      local excess = sat_sub(sat_add(at.used, probe), b.burst)
      if excess == 0 then
        wait = 0
      else
        wait = bucket_refill_time(b, at, excess, now)
      end
    end
    return math.max(wait, 1)
  end

  local function fresh_at(b, s, now)
    return fresh_after(now, reset(b, s, now))
  end

  local function text(b, s)
    return pack_state(s.used, s.anchor, s.refundable)
  end

  -- TokenBucket::next_refill: a full bucket's next step is one period after now.
  local function next_step(b, s, now)
    local at = bucket_refilled(b, s, now)
    if at.used == 0 then return sat_add(now, b.period) end
    return sat_add(at.anchor, b.period)
  end

  return algorithm(params, load, admits, take, give, remaining, reset, until_admitted, fresh_at,
    text, nil, nil, name_take, give_named, next_step)
end
