-- Take back the batches whose lease ran out: their worker died (or its message was lost).
--
-- KEYS: meta, ready, next, busy, leases, day stats (this UTC day), day host stats (this UTC day),
--       queued_urls
-- ARGV: 1 qprefix (the key prefix of the job's per-host queues)   2 max_attempts   3 interval_ms
--       4 day_ttl_s
-- Returns {URLs requeued, URLs failed}
--
-- A reclaimed URL goes back to the front of its host's queue with one more attempt, or fails
-- once it had enough; a failure is also counted in the day's job and host buckets (release.lua).
-- A depth-first or priority job's lease has the URLs' scores (pump.lua): each gets its own back,
-- and a running or paused priority job's URL is in queued_urls again (admit.lua).
local meta, ready, nextk, busy, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local qprefix, max_attempts, interval = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local failed_name = {{PREFIX_FAILED}} .. {{REASON_LEASE_EXPIRED}}
local now = clock_ms()
local _, by_priority = live_priority(meta)
local index = by_priority and KEYS[8]
local all = redis.call('HGETALL', leases)
local back, failed = 0, 0
for j = 1, #all, 2 do
  local lease = cjson.decode(all[j + 1])
  if lease.t < now then
    redis.call('HDEL', leases, all[j])
    local requeued, lease_failed = 0, 0
    for n, member in ipairs(lease.e) do
      local entry = cjson.decode(member)
      entry.a = entry.a + 1
      if entry.a > max_attempts then
        lease_failed = lease_failed + 1
      else
        requeue(qprefix .. lease.h, lease.p and lease.p[n] or entry.d * {{SCORE_DEPTH}}, cjson.encode(entry), index,
                entry.u)
        requeued = requeued + 1
      end
    end
    if redis.call('HINCRBY', busy, lease.h, -1) <= 0 then
      redis.call('HDEL', busy, lease.h)
    end
    if requeued > 0 then
      local not_before = math.max(now, tonumber(redis.call('HGET', nextk, lease.h) or '0')) + interval
      redis.call('HSET', nextk, lease.h, not_before)
      redis.call('ZADD', ready, 'GT', not_before, lease.h)
    end
    if lease_failed > 0 then
      redis.call('HINCRBY', KEYS[6], failed_name, lease_failed)
      redis.call('HINCRBY', KEYS[7], {{HOST_FAILED}} .. lease.h, lease_failed)
    end
    back = back + requeued
    failed = failed + lease_failed
  end
end
if back > 0 then
  redis.call('HINCRBY', meta, {{META_QUEUED_NOW}}, back)
  redis.call('HINCRBY', meta, {{COUNTER_LEASE_EXPIRED}}, back)
end
if failed > 0 then
  redis.call('HINCRBY', meta, failed_name, failed)
  redis.call('EXPIRE', KEYS[6], tonumber(ARGV[4]))
  redis.call('EXPIRE', KEYS[7], tonumber(ARGV[4]))
end
settle(meta, failed, now)
return {back, failed}
