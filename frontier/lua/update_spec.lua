-- Replace a running or paused job's spec.
--
-- KEYS: meta
-- ARGV: 1 spec_json   2 strategy (the spec's: meta's strategy field)
-- Returns the spec's new revision, or nil if the job is not running or paused.
local state = redis.call('HGET', KEYS[1], {{META_STATE}})
if state ~= {{STATE_RUNNING}} and state ~= {{STATE_PAUSED}} then return false end
redis.call('HSET', KEYS[1], {{META_SPEC}}, ARGV[1], {{META_STRATEGY}}, ARGV[2])
return redis.call('HINCRBY', KEYS[1], {{META_SPEC_REV}}, 1)
