-- wrk script: the paths given after `--` in turn, request by request (e.g. `-- /t0 /t1 /t2`:
-- each wrk thread's next request, on whichever of its connections, goes to the next path),
-- with latency.lua's RESULT line.
dofile("loadtest/latency.lua")
local paths = {}
local next_path = 0

function init(args)
  for _, p in ipairs(args) do paths[#paths + 1] = p end
  if #paths == 0 then paths[1] = "/" end
end

function request()
  next_path = next_path % #paths + 1
  return wrk.format("GET", paths[next_path])
end
