-- wrk script for a pipelined load: each connection sends DEPTH requests at once and sends the
-- next DEPTH when all their answers are in. The load generator sleeps and is woken once per
-- batch instead of once per answer, so a server's CPU per request is less a charge for waking
-- it (the closed loop's wake-ups, `sock_def_readable` under the server's `writev`, were 10-20 %
-- of a hit's and a hello's cycles). Both servers of a comparison get the same load.
--
-- Usage: wrk -c32 -s loadtest/pipeline.lua URL -- DEPTH   (DEPTH: 16 when not given)
local batch

function init(args)
  local depth = tonumber(args[1] or "16")
  local requests = {}
  for i = 1, depth do
    requests[i] = wrk.format()
  end
  batch = table.concat(requests)
end

function request()
  return batch
end
