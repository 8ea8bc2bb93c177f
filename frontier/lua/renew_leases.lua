-- Before each further request of paced batches of one job (one, or every batch of a bundle due
-- soon: engine.fetch_bundle): is each lease still held by its run, and the job running in the
-- batch's cycle? A write, on purpose (a counter of renewals): a primary fenced for a failover
-- (writes paused) or demoted to a replica does not answer from a copy that may have lost a lease;
-- the worker waits, or asks the new primary. The write is a small one, and a lease is read, not
-- decoded: its owner is found in its text. A lease's deadline stays: it covers every URL of its
-- batch from its start (engine.jobs.lease_s), and no TIME call is needed.
--
-- KEYS: meta, leases, renewals
-- ARGV: [batch_id, cycle (0: a one-off job), owner token (start_lease's)] per batch
-- Returns one code per batch, in order: 1 go on; 0 the lease is gone (its URLs went back to the
-- queue: fetch no more); 2 the job is paused, finished or in another cycle (hand the rest back);
-- 3 another run owns it (a copy of the batch's message started it after a failover lost this
-- run's start: that run fetches every URL and releases, this one neither fetches nor releases).
-- A lease with no owner (the start was lost, no copy came) is this run's again.
if #ARGV == 0 then return {} end
local state, cycle = unpack(redis.call('HMGET', KEYS[1], {{META_STATE}}, {{META_CYCLE}}))
local codes = {}
local wrote = false
local ids = {}
for i = 1, #ARGV, 3 do ids[#ids + 1] = ARGV[i] end
local leases = redis.call('HMGET', KEYS[2], unpack(ids))  -- one read for a whole bundle
for i = 1, #ARGV, 3 do
  local id, want, token = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local raw = leases[(i + 2) / 3]
  local code = 1
  if not raw then
    code = 0
  else
    -- cjson writes the owner as "o":"<token>"; the entries inside are JSON texts, their quotes
    -- escaped. A plain find, not a pattern: a pattern is tried at every character of the lease.
    local owner = nil
    local at = string.find(raw, '"o":"', 1, true)
    if at then owner = string.sub(raw, at + 5, string.find(raw, '"', at + 5, true) - 1) end
    if token ~= '' and owner and owner ~= token then
      code = 3
    elseif state ~= {{STATE_RUNNING}} or (want ~= '0' and tostring(cycle) ~= want) then
      code = 2
    elseif token ~= '' and not owner then  -- its start was lost: this run's again
      local lease = cjson.decode(raw)
      lease.o = token
      redis.call('HSET', KEYS[2], id, cjson.encode(lease))
      wrote = true
    end
  end
  codes[#codes + 1] = code
end
-- The write (above): a fenced or demoted primary cannot answer yes.
if not wrote then redis.call('INCR', KEYS[3]) end
return codes
