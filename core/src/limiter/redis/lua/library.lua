
-- library: the function-library form (FUNCTION LOAD, then FCALL) ends with this, after every
-- algorithm file, and then registers main.lua's code as its one function (see
-- src/limiter/redis/script/mod.rs). The prelude's MAKERS are all `true` here, so every maker is
-- defined; each algorithm is made now, once, and its maker replaced by one that hands back
-- what was made. A call then makes no closure or table for its algorithms.
local function made(make)
  local algo = make()
  return function() return algo end
end
MAKERS.f, MAKERS.b, MAKERS.w, MAKERS.s, MAKERS.l =
  made(MAKERS.f), made(MAKERS.b), made(MAKERS.w), made(MAKERS.s), made(MAKERS.l)
