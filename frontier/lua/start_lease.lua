-- Mark a leased batch as started: its lease now runs from here, and is this run's (owner token).
--
-- KEYS: meta, leases, holds
-- ARGV: 1 batch_id   2 lease_ms   3 owner token ('' : none asked)   4 the batch's host ('': not asked)
-- Returns 1 (go on), 0 (the lease is gone: a stale message), 2 (the job is not running: give
-- the batch back), 3 (another run started it and still holds it: a second copy of its message;
-- that run fetches, this one does nothing), 4 (its host is held, hold.lua: give the batch back; a
-- batch leased before the hold and started by a process that was not told of it). The same token
-- again (a retried call) goes on.
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
if redis.call('HGET', KEYS[1], {{META_STATE}}) ~= {{STATE_RUNNING}} then return 2 end
local lease = cjson.decode(raw)
local token = ARGV[3] or ''
if token ~= '' and lease.o and lease.o ~= token then return 3 end
local now = clock_ms()
local host = ARGV[4] or ''
if host ~= '' and tonumber(redis.call('HGET', KEYS[3], host) or '0') > now then return 4 end
lease.s = now
lease.t = now + tonumber(ARGV[2])
if token ~= '' then lease.o = token end
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(lease))
return 1
