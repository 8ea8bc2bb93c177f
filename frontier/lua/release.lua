-- End a fetch batch's lease: requeue what it hands back, count, set the host's next time.
--
-- KEYS: meta, ready, next, busy, leases, queue (the batch's host), delays, history, due,
--       stats bucket (this minute), host stats, failures, released, day stats (this UTC day),
--       day host stats (this UTC day), queued_urls, holds
-- ARGV (built by frontier.queue._release_argv):
--   1 batch_id   2 host   3 pause_ms   4 host_delay_ms   5 done   6 crawl_delay_ms (-1: nothing
--   fetched, keep what is known)   7 n_requeue   8 n_history   9 bucket_ttl_s   10 n_failures
--   11 host_done   12 handed_on ('' for nothing)   13 throttle ('=N' / '+N' / '')   14 day_ttl_s
--   then [score, member] * n_requeue, [url, history record, due_s] * n_history,
--        [failure JSON] * n_failures, [counter name, increment]*
-- Returns 1 if this completed the job, 0 if not, -1 if the lease was gone (reclaimed: nothing
-- is counted twice), -2 if this release already ran (a retry: its hand-over is kept).
--
-- handed_on: what the batch hands to its analysis (JSON), kept in `released` until the analysis
-- has admitted it: a worker killed after this release but before it sent the analysis gets its
-- fetch message again, finds the lease gone, and sends this instead.
-- host_done: URLs of the batch taken to an end here, incl. pages handed on to analysis.
-- History records (scheduled jobs: URLs found unchanged or failed) are written with the release
-- that finishes them, so a cycle never completes before they are. The counters also go to the
-- job's per-minute bucket and the host's totals; final failures to the job's recent failures.
-- The day's counters (names.DAY_COUNTERS and failed:*) also go to the job's and the host's
-- buckets of the UTC day, kept day_ttl_s after their day.
-- The host's next time: a pause after the batch started, never before it ended, and later
-- still when the host asked to be left alone (host_delay_ms from now), or while a hold set by
-- another batch of the host runs (hold.lua; an ended hold is dropped here).
-- A depth-first or priority job's lease has its URLs' scores (pump.lua): a URL requeued at the
-- front (a score below names.SCORE_BACK_OF_QUEUE) gets its own score back; a running or paused
-- priority job's requeued URLs are in queued_urls again, for in-links to find (admit.lua).
local meta, ready, nextk, busy, leases, q = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, host, pause, host_delay = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local done, delay, nreq, nhist = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local raw = redis.call('HGET', leases, id)
if not raw then
  -- Gone. If what it handed on is kept, this very release already ran: a retried call whose
  -- first reply was lost (a failover, a dropped connection). Its work stands: say so (-2).
  if ARGV[12] ~= '' and redis.call('HEXISTS', KEYS[13], id) == 1 then return -2 end
  return -1
end
redis.call('HDEL', leases, id)
local now = clock_ms()
local lease = cjson.decode(raw)
local started = lease.s or now
local live, by_priority = live_priority(meta)
local nxt = math.max(now, started + pause, now + host_delay)
local held = tonumber(redis.call('HGET', KEYS[17], host) or '0')
if held > nxt then
  nxt = held
elseif held > 0 and held <= now then
  redis.call('HDEL', KEYS[17], host)
end
if delay > 0 then
  redis.call('HSET', KEYS[7], host, delay)
elseif delay == 0 then
  redis.call('HDEL', KEYS[7], host)
end  -- below 0: nothing was fetched, so nothing new is known about the host's Crawl-delay
if redis.call('HINCRBY', busy, host, -1) <= 0 then
  redis.call('HDEL', busy, host)
end
local bucket_ttl, nfail, host_done = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
if ARGV[12] ~= '' then redis.call('HSET', KEYS[13], id, ARGV[12]) end
-- throttle: the host's run of 429/503 answers, set when the batch had another answer, else added to
local throttle = ARGV[13]
if string.sub(throttle, 1, 1) == '=' then
  redis.call('HSET', KEYS[11], {{HOST_THROTTLED}} .. host, tonumber(string.sub(throttle, 2)))
elseif string.sub(throttle, 1, 1) == '+' then
  redis.call('HINCRBY', KEYS[11], {{HOST_THROTTLED}} .. host, tonumber(string.sub(throttle, 2)))
end
local i = 15
local kept = {}  -- URL -> its score when leased (depth-first and priority jobs), if any is requeued
if nreq > 0 and lease.p then
  for n, score in ipairs(lease.p) do kept[cjson.decode(lease.e[n]).u] = score end
end
local index = by_priority and KEYS[16]
for _ = 1, nreq do
  local score, member = ARGV[i], ARGV[i + 1]
  local url = nil
  if lease.p then  -- a priority job's lease always has p (pump.lua)
    url = cjson.decode(member).u
    if tonumber(score) < {{SCORE_BACK_OF_QUEUE}} and kept[url] then score = kept[url] end
  end
  requeue(q, score, member, index, url)
  i = i + 2
end
for _ = 1, nhist do
  redis.call('HSET', KEYS[8], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[9], ARGV[i + 2], ARGV[i])
  i = i + 3
end
for _ = 1, nfail do
  redis.call('LPUSH', KEYS[12], ARGV[i])
  i = i + 1
end
if nfail > 0 then redis.call('LTRIM', KEYS[12], 0, 199) end
if nreq > 0 then redis.call('HINCRBY', meta, {{META_QUEUED_NOW}}, nreq) end
if host_done > 0 then redis.call('HINCRBY', KEYS[11], {{HOST_DONE}} .. host, host_done) end
redis.call('HSET', meta, {{META_PROGRESS_AT}}, now / 1000)
-- A bucket's TTL is set when one of its counters starts (from 0), not on every write; the TTLs
-- given count from the end of the bucket's minute or day (frontier.queue.release).
local counted, day_counted = false, false
local failed_prefix = {{PREFIX_FAILED}}
-- A day counter -> its field prefix in the host's day bucket ('': the job's day bucket only).
local by_day = {[{{COUNTER_FETCHED}}] = {{HOST_FETCHED}}, [{{COUNTER_STORED}}] = {{HOST_STORED}},
                [{{COUNTER_BYTES}}] = {{HOST_BYTES}}, [{{COUNTER_NEW}}] = '', [{{COUNTER_CHANGED}}] = '',
                [{{COUNTER_UNCHANGED}}] = ''}
while i <= #ARGV do
  local name, incr = ARGV[i], tonumber(ARGV[i + 1])
  redis.call('HINCRBY', meta, name, incr)
  local started = redis.call('HINCRBY', KEYS[10], name, incr) == incr  -- first, always (an `or` would skip it)
  counted = counted or started
  local is_failure = string.sub(name, 1, #failed_prefix) == failed_prefix
  if name == {{COUNTER_FETCHED}} then
    redis.call('HINCRBY', KEYS[11], {{HOST_FETCHED}} .. host, incr)
  elseif name == {{COUNTER_SLOW}} then
    redis.call('HINCRBY', KEYS[11], {{HOST_SLOW}} .. host, incr)
  elseif is_failure then
    redis.call('HINCRBY', KEYS[11], {{HOST_FAILED}} .. host, incr)
  end
  local host_field = is_failure and {{HOST_FAILED}} or by_day[name]
  if host_field then
    day_counted = redis.call('HINCRBY', KEYS[14], name, incr) == incr or day_counted
    if host_field ~= '' then
      day_counted = redis.call('HINCRBY', KEYS[15], host_field .. host, incr) == incr or day_counted
    end
  end
  i = i + 2
end
if counted then redis.call('EXPIRE', KEYS[10], bucket_ttl) end
if day_counted then
  redis.call('EXPIRE', KEYS[14], tonumber(ARGV[14]))
  redis.call('EXPIRE', KEYS[15], tonumber(ARGV[14]))
end
redis.call('HSET', nextk, host, nxt)
if redis.call('ZCARD', q) > 0 and live then
  redis.call('ZADD', ready, 'GT', nxt, host)
end
return settle(meta, done, now)
