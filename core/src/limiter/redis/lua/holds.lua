-- holds: one operation on one key's holds with ids (the Throttle API's AcquireHold,
-- ReleaseHold, ExtendHold), mirroring Concurrency::{acquire, release_id, extend_id} in
-- src/limiter/concurrency.rs, on the sorted set concurrency.lua keeps (loaded and saved by its
-- functions). Its own script (src/limiter/redis/holds.rs): the prelude, concurrency.lua, this.
--
-- KEYS[1]   the key
-- ARGV[1]   "now" override in microseconds, or "" to read Redis TIME
-- ARGV[2]   the operation: "a" acquire, "r" release, "e" extend
-- ARGV[3]   the slots
-- ARGV[4]   the lease in microseconds
-- ARGV[5]   acquire: the count; release, extend: the hold's id
--
-- Reply: { done (1 or 0), id, held (slots held after), wait (microseconds, acquire denied) }

floor, format = math.floor, string.format

local now = clock(ARGV[1])

local c = MAKERS.c()
local key, op, arg = KEYS[1], ARGV[2], clamp(ARGV[5])
local p = c.params(clamp(ARGV[3]), clamp(ARGV[4]), 0, false)
local v = c.load(key, p, now)

-- A record at the back of the admitted holds, expiring at now + lease (at least the newest
-- expiry, so that the list stays in expiry order).
local function push(id, count)
  local expiry = sat_add(now, p.lease)
  local back = v.a[#v.a]
  if back and back.expiry > expiry then expiry = back.expiry end
  v.a[#v.a + 1] = { id = id, expiry = expiry, count = count }
end

local done, id, wait, changed = 0, 0, 0, false
if op == "a" then
  if arg >= 1 and c.admits(p, v, now, arg) then
    id = math.max(v.next_id, floor(now))
    v.next_id = id + 1
    push(id, arg)
    done, changed = 1, true
  else
    wait = c.until_admitted(p, v, now, arg)
  end
elseif op == "r" or op == "e" then
  id = arg
  for i, r in ipairs(v.a) do
    if r.id == id then
      table.remove(v.a, i)
      if op == "e" then push(r.id, r.count) end
      done, changed = 1, true
      break
    end
  end
else
  return redis.error_reply("sluice: unknown hold operation " .. tostring(op))
end

if changed then
  local fresh = c.fresh_at(p, v, now)
  if fresh then
    c.save(key, p, v, now, fresh)
  else
    redis.call("DEL", key)
  end
end

local held = 0
for _, r in ipairs(v.a) do held = sat_add(held, r.count) end
return { done, id, held, wait }
