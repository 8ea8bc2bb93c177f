-- Fail a running or paused job: nothing more is dispatched, and the job says why.
--
-- KEYS: meta
-- ARGV: 1 now_s   2 error (text)
-- Returns 1 if the job failed now, 0 if it was not running or paused.
local state = redis.call('HGET', KEYS[1], {{META_STATE}})
if state ~= {{STATE_RUNNING}} and state ~= {{STATE_PAUSED}} then return 0 end
redis.call('HSET', KEYS[1], {{META_STATE}}, {{STATE_FAILED}}, {{META_FINISHED_AT}}, ARGV[1], {{META_ERROR}}, ARGV[2])
return 1
