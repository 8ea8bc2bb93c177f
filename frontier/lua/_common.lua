-- The prelude of the frontier's scripts that keep time or finish URLs (frontier/scripts.py
-- puts it in front of them).
--
-- Every script reads the clock of the Redis server (TIME), so workers and pumps on machines
-- whose clocks differ still agree on when a host is due.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Mark `done` URLs of the job finished; a running job with none left is completed.
-- Returns 1 if this completed the job, else 0.
local function settle(meta, done, now)
  local pending = redis.call('HINCRBY', meta, {{META_PENDING}}, 0 - done)
  if pending <= 0 and redis.call('HGET', meta, {{META_STATE}}) == {{STATE_RUNNING}} then
    redis.call('HSET', meta, {{META_STATE}}, {{STATE_COMPLETED}}, {{META_FINISHED_AT}}, now / 1000)
    return 1
  end
  return 0
end
