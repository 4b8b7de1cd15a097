-- wrk script: every request carries its own `x-key` (the thread's number and a counter), so
-- a rate limit keyed by that header sees a new key each time.
local counter = 0
local thread_id = 0
local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("id", threads)
end

function init(args)
    thread_id = id or 0
end

function request()
    counter = counter + 1
    return wrk.format("GET", nil, { ["x-key"] = thread_id .. "-" .. counter })
end
