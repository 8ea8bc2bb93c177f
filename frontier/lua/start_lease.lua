-- Mark a leased batch as started: its lease now runs from here, and is this run's (owner token).
--
-- KEYS: meta, leases
-- ARGV: 1 batch_id   2 lease_ms   3 owner token ('' : none asked)
-- Returns 1 (go on), 0 (the lease is gone: a stale message), 2 (the job is not running: give
-- the batch back), 3 (another run started it and still holds it: a second copy of its message;
-- that run fetches, this one does nothing). The same token again (a retried call) goes on.
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
if redis.call('HGET', KEYS[1], {{META_STATE}}) ~= {{STATE_RUNNING}} then return 2 end
local lease = cjson.decode(raw)
local token = ARGV[3] or ''
if token ~= '' and lease.o and lease.o ~= token then return 3 end
local now = clock_ms()
lease.s = now
lease.t = now + tonumber(ARGV[2])
if token ~= '' then lease.o = token end
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(lease))
return 1
