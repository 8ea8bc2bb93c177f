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
-- Returns 1 if this completed the job (or left a partition of a split job idle), else 0.
local function settle(meta, done, now)
  local pending = redis.call('HINCRBY', meta, {{META_PENDING}}, 0 - done)
  if pending <= 0 and redis.call('HGET', meta, {{META_STATE}}) == {{STATE_RUNNING}} then
    -- One partition of a job split over a cluster (frontier.partitions): idle, which is not the
    -- job done; the caller asks every partition.
    if redis.call('HEXISTS', meta, {{META_PARTITIONED}}) == 1 then return 1 end
    redis.call('HSET', meta, {{META_STATE}}, {{STATE_COMPLETED}}, {{META_FINISHED_AT}}, now / 1000)
    return 1
  end
  return 0
end

-- Whether the job is live (running or paused), and whether it is a live priority job: only such
-- a job's requeued URLs go back into queued_urls (a stopped job's was deleted, drop_filter.lua,
-- and would never be again). One HMGET.
local function live_priority(meta)
  local state, strategy = unpack(redis.call('HMGET', meta, {{META_STATE}}, {{META_STRATEGY}}))
  local live = state == {{STATE_RUNNING}} or state == {{STATE_PAUSED}}
  return live, live and strategy == {{STRATEGY_PRIORITY}}
end

-- Put a leased entry (`member`, its URL `url` if known) back in its host's queue `q` with `score`
-- (its kept score, pump.lua, or its depth's front); with `index` (queued_urls of a live priority
-- job, else false) it is there again too, for in-links to find (admit.lua).
local function requeue(q, score, member, index, url)
  redis.call('ZADD', q, score, member)
  if index then redis.call('HSET', index, url or cjson.decode(member).u, member) end
end
