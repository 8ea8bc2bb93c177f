-- Replace a running or paused job's spec.
--
-- KEYS: meta
-- ARGV: 1 spec_json (meta's strategy field stays: a strategy cannot change while the job runs)
-- Returns the spec's new revision, or nil if the job is not running or paused.
local state = redis.call('HGET', KEYS[1], {{META_STATE}})
if state ~= {{STATE_RUNNING}} and state ~= {{STATE_PAUSED}} then return false end
redis.call('HSET', KEYS[1], {{META_SPEC}}, ARGV[1])
return redis.call('HINCRBY', KEYS[1], {{META_SPEC_REV}}, 1)
