-- Cancel a running or paused job: nothing more is dispatched.
--
-- KEYS: meta
-- ARGV: 1 now_s
-- Returns 1 if the job was cancelled, 0 if it was not running or paused.
local state = redis.call('HGET', KEYS[1], {{META_STATE}})
if state ~= {{STATE_RUNNING}} and state ~= {{STATE_PAUSED}} then return 0 end
redis.call('HSET', KEYS[1], {{META_STATE}}, {{STATE_CANCELLED}}, {{META_FINISHED_AT}}, ARGV[1])
return 1
