-- Take back batches sent to a ring node that went down: their URLs go back to the front of their
-- hosts' queues for the hosts' new owners, without an attempt counted against them (the node,
-- not the URL, failed).
--
-- KEYS: meta, ready, next, busy, leases, delays, queued_urls
-- ARGV: 1 qprefix (the key prefix of the job's per-host queues)   2 interval_ms   3.. batch ids
-- Returns the number of URLs requeued.
--
-- The dead node may have sent a request just before it died, so a host's next request waits its
-- interval, or its Crawl-delay when it has one, from now (or from its next time, if later).
-- A depth-first or priority job's lease has the URLs' scores (pump.lua): each gets its own back,
-- and a running or paused priority job's URL is in queued_urls again (admit.lua).
local meta, ready, nextk, busy, leases, delays = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local qprefix, interval = ARGV[1], tonumber(ARGV[2])
local now = clock_ms()
local _, by_priority = live_priority(meta)
local index = by_priority and KEYS[7]
local back = 0
for i = 3, #ARGV do
  local raw = redis.call('HGET', leases, ARGV[i])
  if raw then
    local lease = cjson.decode(raw)
    redis.call('HDEL', leases, ARGV[i])
    for n, member in ipairs(lease.e) do
      local entry = cjson.decode(member)
      requeue(qprefix .. lease.h, lease.p and lease.p[n] or entry.d * {{SCORE_DEPTH}}, member, index, entry.u)
      back = back + 1
    end
    if redis.call('HINCRBY', busy, lease.h, -1) <= 0 then
      redis.call('HDEL', busy, lease.h)
    end
    local wait = interval
    local delay = tonumber(redis.call('HGET', delays, lease.h) or '0')
    if delay > wait then wait = delay end
    local not_before = math.max(now, tonumber(redis.call('HGET', nextk, lease.h) or '0')) + wait
    redis.call('HSET', nextk, lease.h, not_before)
    redis.call('ZADD', ready, 'GT', not_before, lease.h)
  end
end
if back > 0 then
  redis.call('HINCRBY', meta, {{META_QUEUED_NOW}}, back)
  redis.call('HINCRBY', meta, {{COUNTER_HANDED_OVER}}, back)
end
return back
