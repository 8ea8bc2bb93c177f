-- Lease due hosts' URLs as fetch batches.
--
-- KEYS: meta, ready, busy, leases, delays, queued_urls, inlinks
-- ARGV (built by frontier.queue._pump_argv):
--   1 max_batches   2 batch_size   3 per_host   4 interval_ms   5 lease_ms   6 cap (most batches
--   in flight per job)   7 qprefix (the key prefix of the job's per-host queues)   8 nonce (random,
--   per call: a batch's id is its sequence number and the nonce)   9 ahead_ms (hosts due up to
--   this long from now are leased too)   10 owner ('': none; else the lease is started by this run
--   at its host's due time, as start_lease.lua would)
-- Returns {next due (ms, '-1': no host waits; 'stopped': the job is not running), now (ms),
--          cycle, then per batch: id, host, entries (JSON list), paced, starts_at (ms, >= now)}
--
-- ahead_ms: a caller that keeps each batch's start time itself (a bundle: engine.fetch_bundle)
-- leases what is due in the next moments in one call, instead of one call per host as each
-- falls due; a host's requests still start no earlier than its due time.
--
-- A host with a robots.txt Crawl-delay (or not yet fetched, in a job without an interval) gets
-- one URL at a time, one batch at a time (not yet fetched, in a job with one: one batch at a time). Other hosts get batches of up to batch_size URLs, their queue shared out over their
-- free slots. Otherwise a host with a free slot stays in the heap, due again after the interval.
-- paced is '1' when the host waits between requests (a Crawl-delay, robots.txt unknown, or the
-- job's interval).
--
-- Strategies (meta's strategy field, admit.lua): a priority job takes, among its due hosts (the
-- room * 16 most overdue, at most 256), those whose best queued URL ranks highest first. A depth-first or priority
-- job's lease keeps its URLs' scores (p), so a URL requeued (release, reclaim, hand-over) keeps
-- its place; a priority job's popped URLs leave queued_urls (no in-link finds them any more) and
-- inlinks (so it holds queued URLs only; a URL requeued counts up to 10 in-links again, on top of
-- the bonus its score kept).
local meta, ready, busy, leases, delays = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local queued_urls, inlinks = KEYS[6], KEYS[7]
local strategy, cycle, state, seq = unpack(redis.call('HMGET', meta, {{META_STRATEGY}}, {{META_CYCLE}}, {{META_STATE}},
  {{META_BATCH_SEQ}}))
seq = tonumber(seq or '0')  -- counted here, written once at the end with the other counts (a script runs alone)
local leased_urls = 0
local by_priority = strategy == {{STRATEGY_PRIORITY}}
local keep_scores = by_priority or strategy == {{STRATEGY_DEPTH_FIRST}}
local now = clock_ms()
local max_batches, batch_size, per_host = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local interval, lease_ms, cap, qprefix = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
-- The nonce keeps ids unique when the sequence goes back: a failover to a replica that missed the
-- primary's last writes hands out numbers already given to batches whose analyses still run.
local nonce = ARGV[8]
local ahead, owner = tonumber(ARGV[9] or '0'), ARGV[10] or ''
local out = {'-1', tostring(now), cycle or '0'}
if state ~= {{STATE_RUNNING}} then
  out[1] = 'stopped'
  return out
end
local busy_batches = redis.call('HLEN', leases)
local room = cap - busy_batches
if room > max_batches then room = max_batches end
if room > 0 then
  local hosts
  local due_at = {}  -- host -> its score in ready (when it is due), where read
  if by_priority then
    -- The due hosts by their best URL (lowest score), then by due time. The window grows with
    -- the room (16 hosts per batch that fits, at most 256): one batch's pick costs 16 reads.
    -- When every due host fits in the room, each gets its batch anyway: no ranking needed.
    local due = redis.call('ZRANGEBYSCORE', ready, '-inf', now + ahead, 'LIMIT', 0, math.min(256, room * 16))
    if #due > room then
      local best, order = {}, {}
      for n, host in ipairs(due) do
        local head = redis.call('ZRANGE', qprefix .. host, 0, 0, 'WITHSCORES')
        best[host] = head[2] and tonumber(head[2]) or math.huge
        order[host] = n
      end
      table.sort(due, function(a, b)
        if best[a] ~= best[b] then return best[a] < best[b] end
        return order[a] < order[b]
      end)
    end
    hosts = {}
    for n = 1, math.min(room, #due) do hosts[n] = due[n] end
  else
    local flat = redis.call('ZRANGEBYSCORE', ready, '-inf', now + ahead, 'WITHSCORES', 'LIMIT', 0, room)
    hosts = {}
    for j = 1, #flat, 2 do
      hosts[#hosts + 1] = flat[j]
      due_at[flat[j]] = tonumber(flat[j + 1])
    end
  end
  for _, host in ipairs(hosts) do
    local q = qprefix .. host
    local starts = now
    if ahead > 0 then
      starts = math.max(now, due_at[host] or tonumber(redis.call('ZSCORE', ready, host) or now))
    end
    local inflight = tonumber(redis.call('HGET', busy, host) or '0')
    local slots, size, paced = per_host, batch_size, '0'
    local crawl_delay = redis.call('HGET', delays, host)
    if crawl_delay then
      slots, paced = 1, '1'
      -- robots.txt not read yet (-1): a job paced at an interval reads it, then fetches the
      -- batch's URLs at its pace (engine.fetch_batch); they stop at a Crawl-delay it finds
      if crawl_delay ~= '-1' or interval <= 0 then size = 1 end
    end
    if inflight >= slots then
      redis.call('ZREM', ready, host)
    else
      -- While the job has few batches in flight (workers idle, e.g. waiting on slow servers),
      -- a host's queue is shared out over its free slots so its requests go in parallel; once
      -- half the in-flight cap is used, batches are full (fewer tasks per page, less CPU).
      if busy_batches < cap / 2 then
        local share = math.ceil(redis.call('ZCARD', q) / (slots - inflight))
        if share < size then size = math.max(1, share) end
      end
      local popped = redis.call('ZPOPMIN', q, size)
      if #popped == 0 then
        redis.call('ZREM', ready, host)
      else
        local entries, scores, urls = {}, {}, {}
        for j = 1, #popped, 2 do
          entries[#entries + 1] = popped[j]
          scores[#scores + 1] = popped[j + 1]  -- a string: cjson would round a number to 14 digits
          if by_priority then urls[#urls + 1] = cjson.decode(popped[j]).u end
        end
        if #urls > 0 then  -- at most frontier_batch (<= 1000) URLs: well within unpack's limit (~8000)
          redis.call('HDEL', queued_urls, unpack(urls))
          redis.call('HDEL', inlinks, unpack(urls))
        end
        seq = seq + 1
        local id = seq .. '.' .. nonce
        redis.call('HINCRBY', busy, host, 1)
        local lease = {h = host, e = entries, t = starts + lease_ms}
        if keep_scores then lease.p = scores end
        if owner ~= '' then
          lease.s, lease.o = starts, owner
        end
        redis.call('HSET', leases, id, cjson.encode(lease))
        leased_urls = leased_urls + #entries
        if inflight + 1 < slots and redis.call('ZCARD', q) > 0 then
          redis.call('ZADD', ready, starts + interval, host)
        else
          redis.call('ZREM', ready, host)
        end
        busy_batches = busy_batches + 1
        out[#out + 1] = tostring(id)
        out[#out + 1] = host
        out[#out + 1] = cjson.encode(entries)
        out[#out + 1] = (paced == '1' or interval > 0) and '1' or '0'
        out[#out + 1] = tostring(starts)
      end
    end
  end
end
if leased_urls > 0 then
  redis.call('HSET', meta, {{META_BATCH_SEQ}}, seq)
  redis.call('HINCRBY', meta, {{META_QUEUED_NOW}}, -leased_urls)
  redis.call('HINCRBY', meta, {{META_DISPATCHED}}, leased_urls)
end
local first = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
if #first > 0 then out[1] = first[2] end
return out
