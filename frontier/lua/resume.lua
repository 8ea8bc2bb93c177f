-- Resume a paused job.
--
-- KEYS: meta
-- ARGV: none
-- Returns 0 (it was not paused), 1 (running again), 2 (nothing was left: completed).
local meta = KEYS[1]
if redis.call('HGET', meta, {{META_STATE}}) ~= {{STATE_PAUSED}} then return 0 end
redis.call('HSET', meta, {{META_STATE}}, {{STATE_RUNNING}})
redis.call('HDEL', meta, {{META_PAUSED_AT}})
return 1 + settle(meta, 0, clock_ms())
