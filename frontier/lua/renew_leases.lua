-- renew_lease.lua for several paced batches of one job at once (a bundle renews every batch whose
-- next request is due soon in one call: engine.fetch_bundle). Same answers, batch by batch.
--
-- KEYS: meta, leases, renewals
-- ARGV: [batch_id, cycle (0: a one-off job), owner token] per batch
-- Returns one code per batch, in order: 1 go on, 0 the lease is gone, 2 the job is paused,
-- finished or in another cycle, 3 another run owns it (renew_lease.lua says more).
local state, cycle = unpack(redis.call('HMGET', KEYS[1], {{META_STATE}}, {{META_CYCLE}}))
local codes = {}
local wrote = false
for i = 1, #ARGV, 3 do
  local id, want, token = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local raw = redis.call('HGET', KEYS[2], id)
  local code = 1
  if not raw then
    code = 0
  else
    -- cjson writes the owner as "o":"<token>"; the entries inside are JSON texts, their quotes escaped
    local owner = string.match(raw, '"o":"([^"]*)"')
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
-- A write, on purpose (renew_lease.lua): a fenced or demoted primary cannot answer yes.
if not wrote then redis.call('INCR', KEYS[3]) end
return codes
