-- sluice: a batch of requests' limits, each request decided atomically (all or nothing), for
-- every algorithm.
--
-- This script is the concatenation of src/limiter/redis/lua/*.lua, in the order given by
-- src/limiter/redis/script/mod.rs: this prelude (the contract and integer helpers), one file per
-- algorithm, then main.lua (evaluate, plan, commit, write, report). It mirrors the Rust pure
-- functions (src/limiter/{funnel,token_bucket,fixed_window,sliding_window,sliding_log,concurrency}.rs), src/limiter/plan.rs (all or nothing) and
-- src/limiter/memory/decide.rs (evaluate with an overlay, plan, commit from the original states,
-- report, write). Any change there must be made here too; tests/redis/script.rs checks that both
-- give identical outcomes on random sequences.
--
-- The same files also make the function library that sluice loads with FUNCTION LOAD and
-- calls with FCALL (Redis 7 and later): there the code from main.lua is the body of the
-- library's one function, whose KEYS and ARGV are the same as the script's, and library.lua
-- makes every algorithm once, when the library loads (see MAKERS below).
--
-- Time unit: MICROSECONDS. Lua numbers are doubles, exact for integers up to 2^53 - 1; Unix
-- time in microseconds is about 2^51 today, so every time and duration below is exact.
-- Arithmetic saturates at MAX = 2^53 - 1 (the Rust functions saturate at 2^64 - 1; the two agree
-- whenever neither saturates, i.e. for any state less than ~250 years ahead of now).
--
-- A call carries a batch of R requests (group commit: the requests that arrived while the
-- previous call was in flight), decided one after the other in the order given, each exactly
-- as if it were alone (its own all or nothing); all of them at one `now`.
--
-- KEYS[s]      the distinct state keys of the batch (prefix included), s = 1, 2, ..., in
--              order of first appearance; then the other keys the call may touch: the lease
--              records (KEYS[s] .. LEASE_SUFFIX) of a lease request's key and the penalty box
--              (KEYS[s] .. BLOCK_SUFFIX) of a key whose limit has one, each once. Every key
--              the script touches is in KEYS, so Redis Cluster routes the call (all keys of
--              one call must share a slot there: each shares its state key's hash tag) and,
--              while a slot moves, checks them all before the script runs. The script finds
--              those keys by name (state key and suffix), never by their index; the state
--              keys' MGET reads them too (nil for a hash).
--
-- ARGV[1]      "now" override in microseconds, or "" to read Redis TIME (the normal case).
--              Only tests set it, to drive the script on a controlled clock.
-- ARGV[2]      L, the number of distinct limits of the batch; then 7 fields per limit
--              l = 1..L, at 3 + 7*(l-1), sent once however many hits share the limit:
--   +0 algo    "f" funnel, "b" token bucket, "w" fixed window, "s" sliding window,
--              "l" sliding log, "c" concurrency
--   +1 quota   Q, requests per period (0 = zero quota)
--   +2 period  P in microseconds (>= 1 after clamping)
--   +3 burst   B
--   +4 flags   the sum of 1 (borrow) and 2 (charge: always): "0" to "3"
--   +5 block   the penalty box (block_for) in microseconds, "0" for none: once the limit
--              denies a key, the key is denied until now + block, the wait reported being
--              the time to the block's end. The block is kept in the key KEYS[s] .. ":block"
--              (BLOCK_SUFFIX; a state key never ends so, and it shares the state key's hash
--              tag, so its slot), holding the end in microseconds, with a TTL to that end.
--   +6 window  "" or, for a fixed window with calendar windows (time_zone), four instants
--              in microseconds computed by sluice from the tz database: "previous,start,
--              end,next": the window holding sluice's clock is [start, end), the one before
--              starts at previous, the one after ends at next. The script takes the one of
--              the three that holds its own `now` (Redis TIME), so replicas agree.
-- ARGV[3+7L]   R, the number of requests
-- ARGV[4+7L]   the requests, one after the other, as one binary string (little-endian, no
--              padding; read with Redis Lua's struct.unpack, no string or number parsing per
--              hit), per request:
--   mode       1 byte (REQUEST_FORMAT "B"): 0 for all or nothing over the request's hits,
--              1 "independent" (each descriptor group consumes when all of its hits admit,
--              whatever the others do; used for one slot group of a Redis Cluster request,
--              the caller then plans the whole request and refunds what must not have been
--              consumed), 2 "dry run" (decided and reported as 0 would be, but nothing is
--              written: admin /why), 3 "lease" (a replica's lease on the request's one hit's
--              key: below)
--   H          4 bytes (REQUEST_FORMAT "I4"): the number of the request's hits; then
--              HIT_BYTES = 21 bytes per hit h = 1..H (HIT_FORMAT):
--   slot       I4: index into KEYS (1-based) of the hit's state key
--   limit      I4: index (1-based) of the hit's limit above
--   cost       d:  the cost (0 = check only), an integral double (exact below 2^53)
--   group      I4: the descriptor the hit belongs to (equal for one descriptor)
--   role       B:  0 enforced, 1 shadow, 2 quota mode; plus 8 to give the cost back
--              (is_negative_hits) instead of taking it; plus 16 when the hit names its hold
--              (a concurrency rule's hold_id): then HOLD_BYTES = 8 more bytes follow, the
--   hold       d:  the hold's id, an integral double in [2^52, 2^53) (concurrency.lua)
--              A lease request (mode 3) has one hit, whose cost is the units wanted (0:
--              return only), then LEASE_BYTES = 40 more bytes (LEASE_FORMAT):
--   give       d:  units of the replica's current lease on the key to give back (its record
--              says which lease that is, and until when it may come back)
--   least      d:  the cost of the request asking: a lease is a whole number of it (no
--              lease when not even one can be granted)
--   validity   d:  the most the new lease may be valid, in microseconds
--   replica    d:  the replica's id, an integral double below 2^53
--   deadline   d:  Redis's time (microseconds) after which the request does nothing at all
--              (0: none; a region's request to the home Redis that arrives after its
--              caller gave up on it: it neither gives back nor takes anything)
--
-- Leases (src/limiter/lease.rs has the rules, src/limiter/redis/lease.rs the replica's side):
-- a lease request returns what is left of the replica's old lease on the key and takes a new
-- one. The lease requests of a call are decided first, in their order, then the others (all
-- the requests of a call were in flight at once, so this is an order they could have come
-- in). A lease expires at min(now + validity, horizon), the horizon being where the
-- algorithm's count starts over (a window's end, calendar windows included; a token bucket's
-- next refill step, one period after now for a full bucket; none for a funnel); it holds at
-- most a quarter of what remains (at least 1); its units are taken as spent at its last
-- moment, last = expires - 1 (a token bucket's at now, in the refill step that holds the
-- whole lease), a whole number of `least` (else none), as a named take (so that no anonymous refund gives them back), and granted
-- only while the state then admits nothing beyond its bound at now. A return gives the units
-- back by name at now: a window's to the window they were counted in while it lasts, a
-- bucket's to the refill step (even after the lease expired: they were never spent); a
-- funnel's only before the expiry and while its state is as the grant left it (the lease's
-- slots are then the last ones, all still ahead of now). Only a funnel, token bucket, fixed
-- or sliding window, without borrow, charge: always or a penalty box, is leased; another
-- limit gets no lease (and gives nothing back).
-- A key's leases are kept in KEYS[s] .. LEASE_SUFFIX (in the key's slot, as the penalty box
-- is): a hash, field a replica's id, value "units:expires:returnable:mark:state"
-- (microseconds, exclusive: the units may be spent before expires, given back before
-- returnable: a funnel's expiry, a window's end, a bucket's next refill step; mark: the
-- algorithm's `name_take` of the grant, which its return by name needs; state: the key's
-- text as the grant left it); its TTL reaches the latest returnable. A reset deletes it with
-- the state, so that no return made after the reset gives anything back.
--
-- The limits' fields are decimal integers, each parsed once; the requests are unpacked,
-- whole, before any key is read (a malformed call fails before anything is written).
--
-- Reply: one binary string of integers, each a little-endian double (8 bytes; exact, since
-- each is at most 2^53 - 1 in size), packed by struct.pack REPLY_CHUNK at a time (it costs
-- Redis what an array reply did, and sluice reads it without parsing an item per number); per
-- lease request (decided first, see above), in order: now, units given back, the new
-- lease's units (0: none) and expiry, what the key holds after the call and its reset
-- (microseconds), every leased unit counted; then per other request, in order:
-- request_admitted (1 or 0), then per hit, one of:
--   remaining, reset_micros   admitted (remaining >= 0); reset: until the full quota is back
--   -1, wait_micros           denied (REPLY_DENIED); wait: until this hit would be admitted
--   -2                        admitted, on the same key and limit as the admitted hit before
--                             it in the request (REPLY_SAME): the same remaining and reset
--
-- Storage: each key holds its algorithm's state (the format is at the top of each algorithm's
-- file). A key a cost was applied to is written back with a TTL of exactly the time until its
-- state is fresh again (rounded up to the millisecond), or deleted when it already is.
-- Keys no cost touched (check-only hits, denied requests) are not written, except a
-- concurrency key, which keeps a denied request's cost as a pending denial.
--
-- Commands per call: the states stored as one string (every algorithm but the sliding log)
-- are read with one MGET for the whole call (one per MGET_KEYS keys), before the first
-- request is decided, and kept in a table; a request's writes go to that table, which the
-- later requests of the call read; after the last request, each key a request changed is
-- written once, as the last one left it: SET ... PX with its TTL, or DEL (nothing when Redis
-- did not hold it before the call and it is fresh again). This leaves Redis exactly as
-- writing at each request would: the call runs alone and whole, every request at the same
-- `now`, Redis expires no key during a call, and the script reads no key but through the
-- table, so no request can tell. A sliding log (a sorted set) reads and writes its key
-- itself, as its requests are decided.

local MAX = 9007199254740991
-- The library functions called per hit, looked up once per call by main.lua (a global's
-- field costs two table lookups at each use; a function library cannot read them when it is
-- loaded, so they are set at the start of each call).
local floor, format

-- The binary layout of ARGV[4+5L] (see above), and the role codes.
local REQUEST_FORMAT, REQUEST_BYTES = "<BI4", 5
local HIT_FORMAT, HIT_BYTES = "<I4I4dI4B", 21
local HOLD_FORMAT, HOLD_BYTES, ROLE_HOLD = "<d", 8, 16
local LEASE_MODE, LEASE_FORMAT, LEASE_BYTES, LEASE_SUFFIX = 3, "<ddddd", 40, ":lease"
local ROLE_ENFORCED, ROLE_QUOTA, ROLE_QUOTA_SHADOW = 0, 2, 3
-- The reply's markers (see above), and how many of its numbers one struct.pack takes (they go
-- through Lua's stack as arguments, like MGET's keys below).
local REPLY_DENIED, REPLY_SAME = -1, -2
-- The suffix of a penalty box's key (see ARGV's +5 block).
local BLOCK_SUFFIX = ":block"
local REPLY_CHUNK = 512
-- At most this many keys per MGET (see main.lua): a call's arguments go through Lua's stack
-- (`unpack` fails at about 8,000), and a batch of 64 requests of 10 descriptors needs two.
local MGET_KEYS = 512

-- Per algorithm code, a function building that algorithm's table of functions. The script
-- runs whole on every call, so an algorithm's functions are only made for the requests that
-- use it (making every closure every time costs more than the decision itself), and so is
-- its maker: MAKERS starts as `true` for each algorithm code of the batch's limits (field +0
-- of each limit, see ARGV[2] above), and each algorithm file assigns
-- `MAKERS.<code> = MAKERS.<code> and function() ... end`, which makes no closure for an
-- algorithm that no limit of the request uses. Each maker returns its table from one
-- constructor, sized once (a table grown key by key is rehashed at every power of two).
-- Every closure, table and string a call makes is garbage for Redis's Lua collector
-- afterwards: allocation is most of what a call costs (a small table about 2,000
-- instructions, a closure 650), so the script makes few. In the function library the line
-- below is replaced by one that marks every code, and library.lua makes each algorithm once.
local MAKERS = {}
for l = 1, tonumber(ARGV[2]) or 0 do MAKERS[ARGV[7 * l - 4]] = true end

local function sat_add(a, b)
  local s = a + b
  if s > MAX then return MAX end
  return s
end

local function sat_mul(a, b)
  local p = a * b
  if p > MAX then return MAX end
  return p
end

local function sat_sub(a, b)
  if a > b then return a - b end
  return 0
end

-- floor(a / b) for integers 0 <= a <= MAX, b >= 1, corrected for the rounding of the division.
local function div_floor(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end

-- ceil(a / b) for integers 0 <= a <= MAX, b >= 1.
local function div_ceil(a, b)
  local q = div_floor(a, b)
  if q * b < a then q = q + 1 end
  return q
end

local function clamp(text)
  local n = tonumber(text) or 0
  if n > MAX then return MAX end
  if n < 0 then return 0 end
  return floor(n)
end

-- The call's time in microseconds: `override` when set (ARGV[1]: tests pass a manual clock),
-- else Redis's TIME, so that every replica reads one clock.
local function clock(override)
  if override ~= "" then return clamp(override) end
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- An integer as decimal text, formatted as an integer (every number here is integral and below
-- 2^53; tostring would write large ones in exponent form, "%.0f" goes through float printing).
local function fmt(n)
  return format("%d", n)
end

-- The TTL, in milliseconds (at least 1), of a state fresh again at `fresh_at`: the time from
-- `now` rounded up to the millisecond.
local function ttl_ms(now, fresh_at)
  local ms = floor((fresh_at - now + 999) / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

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

-- A number read from a packed state, as clamp reads text: NaN and below 0 are 0, above MAX
-- is MAX, and a fraction is dropped.
local function clamp_number(n)
  if n ~= n or n < 0 then return 0 end
  if n > MAX then return MAX end
  return floor(n)
end

-- How a funnel's, token bucket's, fixed or sliding window's state is stored: STATE_MARK, then
-- its fields as little-endian doubles (exact: each is integral and at most MAX). One
-- struct.unpack reads it and one struct.pack writes it, about a fifth of what parsing and
-- formatting the fields as decimal text cost. A text state never starts with STATE_MARK (it
-- starts with a digit), so the older text formats are told apart and still read.
local STATE_MARK = 1
local STATE_FORMATS = { [3] = "<Bddd", [4] = "<Bdddd" }

-- The packed state of three or four fields.
local function pack_state(a, b, c, d)
  if d == nil then return struct.pack("<Bddd", STATE_MARK, a, b, c) end
  return struct.pack("<Bdddd", STATE_MARK, a, b, c, d)
end

-- The `count + 1` fields of a state (the last one the refundable units), from the key's value
-- (false when the key is absent): packed, or the older text of `count` numbers joined by ":"
-- (nothing refundable) or of `count + 1`. Nil when it is absent or malformed.
local function load_fields(text, count)
  if not text then return nil end
  local fields = count + 1
  if #text == 1 + 8 * fields and string.byte(text, 1) == STATE_MARK then
    local _, a, b, c, d = struct.unpack(STATE_FORMATS[fields], text)
    if d then d = clamp_number(d) end
    return { clamp_number(a), clamp_number(b), clamp_number(c), d }
  end
  local n = {}
  for part in string.gmatch(text, "[^:]+") do n[#n + 1] = clamp(part) end
  if #n == count then
    n[count + 1] = 0
    return n
  end
  if #n == count + 1 then return n end
  return nil
end

-- When a state whose reset is `wait` from `now` is fresh again: nil (fresh now) for no wait.
local function fresh_after(now, wait)
  if wait > 0 then return sat_add(now, wait) end
  return nil
end

-- Whether a window holding `count` admits `cost` more under `quota` (a quota of 0 admits only
-- a cost of 0).
local function count_admits(quota, count, cost)
  if quota == 0 then return cost == 0 end
  return sat_add(count, cost) <= quota
end

-- An algorithm's table of functions, as each maker returns it (see MAKERS above): one
-- constructor, sized once. main.lua calls these by name.
--
-- A state is stored in one of two ways, and the table says which:
-- - as one string value (funnel, token bucket, fixed window, sliding window): `text` is set
--   and `save` is nil. main.lua reads every such key of a call with one MGET before deciding
--   anything, hands `load(text)` the key's text (false when absent), and keeps the text that
--   `text(params, state)` makes of each new state; each key so changed is written once, after
--   the last request of the call (see "Storage" above).
-- - otherwise (sliding log: a sorted set): `save` is set and `text` is nil; `load(key, params,
--   now)` and `save(key, params, state, now, fresh_at)` read and write the key themselves.
--
-- `name_take(params, state, now[, cost])` names the take just made (a reservation's, with its
-- cost, or a lease's): it returns the state (the funnel keeps anonymous refunds off the units
-- taken so far) and the mark a return by name needs; `give_named(params, state, now, units,
-- mark)` returns units of such a take, exactly (reserve.lua's commit). They mirror
-- Algo::name_take (Algo::name_reservation with the cost) and Algo::give_back_named.
-- `deny(params, state, now, cost)`, set only by concurrency, keeps what a denied request
-- leaves behind (its pending denial); main.lua calls it for each hit of a denied request.
-- `take_id(params, state, now, cost, id)` and `give_id(...)`, set only by concurrency, take
-- and give back under a hold the request names (a hit with a hold id); main.lua calls them
-- instead of `take` and `give` for such a hit.
-- `next_step(params, state, now)`, set only by the token bucket, is its next refill step after
-- now (TokenBucket::next_refill): where a lease on it must end (main.lua's leases).
local function algorithm(params, load, admits, take, give, remaining, reset, until_admitted,
                         fresh_at, text, save, deny, name_take, give_named, next_step)
  return {
    params = params, load = load, admits = admits, take = take, give = give,
    remaining = remaining, reset = reset, until_admitted = until_admitted, fresh_at = fresh_at,
    text = text, save = save, deny = deny, name_take = name_take, give_named = give_named,
    next_step = next_step,
  }
end
