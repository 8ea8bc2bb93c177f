-- Pause a running job.
--
-- KEYS: meta
-- ARGV: 1 now_s
-- Returns 1 if the job was paused, 0 if it was not running.
--
-- Paused: nothing is dispatched; batches not yet started are handed back unfetched, a running
-- batch stops before its next URL; links found meanwhile are still admitted (queued).
if redis.call('HGET', KEYS[1], {{META_STATE}}) ~= {{STATE_RUNNING}} then return 0 end
redis.call('HSET', KEYS[1], {{META_STATE}}, {{STATE_PAUSED}}, {{META_PAUSED_AT}}, ARGV[1])
return 1
