-- wrk script for a paced load: each connection waits DELAY ms after every response before it
-- sends again, so the rate is set by the connections and the delay, not by how fast the server
-- answers (as long as it answers well within DELAY). Two servers, or two settings of one, are then
-- offered the same load, and their CPU per request can be compared without the closed loop's
-- feedback (a slower server lets the load generator sleep more, and pays for waking it).
--
-- Usage: wrk -c64 -s loadtest/paced.lua URL -- DELAY_MS [SAMPLED] [KEYED]
--   SAMPLED, when given (and not `-`), adds a W3C traceparent whose sampled flag is SAMPLED (00
--   or 01). KEYED = `keyed` sends each request as another client: an `x-user` header of 16
--   random hex digits (a gradual deployment's split key).
-- Prints latency.lua's RESULT line.
local delay_ms = 4
local keyed = false

function init(args)
  delay_ms = tonumber(args[1] or "4")
  if args[2] and args[2] ~= "-" then
    wrk.headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-" .. args[2]
  end
  keyed = args[3] == "keyed"
end

function request()
  if keyed then
    wrk.headers["x-user"] = string.format("%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
  end
  return wrk.format()
end

function delay()
  return delay_ms
end

-- The RESULT line of latency.lua, which sits beside this script.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or ""
dofile(here .. "latency.lua")
