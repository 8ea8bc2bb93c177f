-- Mark a leased batch as started: its lease now runs from here.
--
-- KEYS: meta, leases
-- ARGV: 1 batch_id   2 lease_ms
-- Returns 1 (go on), 0 (the lease is gone: a stale message), 2 (the job is not running: give
-- the batch back).
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
if redis.call('HGET', KEYS[1], {{META_STATE}}) ~= {{STATE_RUNNING}} then return 2 end
local lease = cjson.decode(raw)
local now = clock_ms()
lease.s = now
lease.t = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(lease))
return 1
