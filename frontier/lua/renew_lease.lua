-- Before each further request of a paced batch: is its lease still held by this run, and its job
-- running in its cycle? A write, on purpose (a counter of renewals): a primary fenced for a
-- failover (writes paused) or demoted to a replica does not answer it from a copy that may have
-- lost the lease; the worker waits, or asks the new primary. The write is a small one, and the
-- lease is read, not decoded: its owner is found in its text. The lease's deadline stays: it
-- covers every URL of the batch from its start (engine.jobs.lease_s), and no TIME call is needed.
--
-- KEYS: meta, leases, renewals
-- ARGV: 1 batch_id   2 cycle (0: a one-off job)   3 owner token (start_lease's)
-- Returns 1 (go on), 0 (the lease is gone: its URLs went back to the queue; fetch no more),
-- 2 (the job is paused, finished or in another cycle: hand the rest back), 3 (another run owns
-- it: a copy of the batch's message started it after a failover lost this run's start; that run
-- fetches every URL and releases, this one neither fetches nor releases). A lease with no owner
-- (the start was lost, no copy came) is this run's again.
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local token = ARGV[3] or ''
-- cjson writes the owner as "o":"<token>"; the entries inside are JSON texts, their quotes escaped
local owner = string.match(raw, '"o":"([^"]*)"')
if token ~= '' and owner and owner ~= token then return 3 end
local state, cycle = unpack(redis.call('HMGET', KEYS[1], {{META_STATE}}, {{META_CYCLE}}))
if state ~= {{STATE_RUNNING}} then return 2 end
if ARGV[2] ~= '0' and tostring(cycle) ~= ARGV[2] then return 2 end
if token ~= '' and not owner then
  local lease = cjson.decode(raw)
  lease.o = token
  redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(lease))
else
  redis.call('INCR', KEYS[3])
end
return 1
