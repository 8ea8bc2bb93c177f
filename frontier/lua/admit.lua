-- Admit candidate URLs into a job's per-host queues: dedup, queue, count, finish `done` URLs.
--
-- KEYS: meta, ready, next, busy, admit_tokens, bloom segment (1..s), queue (host 1..n), delays,
--       history, due, queued_urls, inlinks, released
-- ARGV (built by frontier.queue._admit_call):
--   1 max_pages   2 per_host   3 done   4 token ('' for none)   5 hashes (Bloom k)
--   6 n_segments   7 n_counters   8 history_mode   9 cycle   10 n_history
--   then [counter name, increment] * n_counters,
--        [url, history record, due_s] * n_history,
--        n_hosts, [host] * n_hosts,
--        per URL: [segment index, host index, depth, priority (hundredths), member, k Bloom offsets],
--        then last: analysed (the fetch batches whose pages this finishes: "id done id done ...",
--        '' for none; `done` is their sum)
-- Returns {completed (1 if this completed the job, -1 a repeated token, -2 another cycle, -3
--          batches whose release this Redis never saw, all of them),
--          admitted, duplicates, over_limit, not_due, unknown (such batches, when others were finished)}
--
-- A URL is admitted only if the Bloom filter has not seen it; both happen in this one script,
-- so no URL can be marked seen without being queued. `token` makes a retried call a no-op.
-- history_mode (scheduled jobs): 0 none; 1 a URL over the page limit is kept in the history as
-- due, so a later cycle fetches it; 2 as 1, and a URL the history knows is left to its due time
-- (a link to it from a changed page does not fetch it early). A call for another cycle than the
-- job's current one does nothing (a late analysis of a finished cycle); the history records of
-- the pages it finishes are written in the same step, so no cycle ends before they are.
--
-- The queue score follows the job's strategy (meta's strategy field; the constants are
-- vcrawl.names.SCORE_*): breadth-first depth * SCORE_DEPTH + seq (shallower first, FIFO within a
-- depth); depth-first -depth * SCORE_DEPTH - seq (deeper first, LIFO within a depth); priority
-- -priority (hundredths) * SCORE_HUNDREDTH + seq (higher first, FIFO within a priority). In both
-- of the latter a sitemap to read scores SCORE_SITEMAP_FIRST - seq, ahead of every page. A
-- priority job keeps each queued URL's entry in queued_urls; a link to a URL still queued (a
-- duplicate) raises its score by names.INLINK_BONUS (SCORE_INLINK), for at most INLINK_CAP
-- in-links, counted in inlinks.
local meta, ready, nextk, busy, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = clock_ms()
local max_pages, per_host, done = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local token, k, nseg = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local history_mode, cycle, nhist = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local i = 11
local current, strategy, state, admitted, seq = unpack(redis.call('HMGET', meta, {{META_CYCLE}},
  {{META_STRATEGY}}, {{META_STATE}}, {{META_ADMITTED}}, {{META_SEQ}}))
if cycle > 0 and tonumber(current or '0') ~= cycle then
  -- A late analysis of an earlier cycle: its pages are not lost, they are due in a later cycle.
  local nhosts_at = i + 2 * tonumber(ARGV[7]) + 3 * nhist
  local hist, due = KEYS[7 + nseg + tonumber(ARGV[nhosts_at])], KEYS[8 + nseg + tonumber(ARGV[nhosts_at])]
  for j = i + 2 * tonumber(ARGV[7]), nhosts_at - 1, 3 do
    redis.call('HSETNX', hist, ARGV[j], '[' .. cjson.decode(ARGV[j + 1])[1] .. ']')
    redis.call('ZADD', due, 'LT', 0, ARGV[j])
  end
  return {-2, 0, 0, 0, 0}
end
-- A batch's release keeps what it hands to analysis in `released` until this call finishes its
-- pages. A batch with pages to finish that is not there, and not finished before (its token), was
-- released on a primary whose last writes a failover lost: here its URLs are still leased or
-- queued, and will be fetched and finished again. Finishing them now would count them twice: of
-- the batches a call finishes (several, gathered by a bundle: engine.fetch_bundle), only those
-- still there are finished; if none is, the call does nothing.
local released, analysed = KEYS[#KEYS], ARGV[#ARGV]
local queued_urls, inlinks = KEYS[#KEYS - 2], KEYS[#KEYS - 1]
local by_priority, lifo = strategy == {{STRATEGY_PRIORITY}}, strategy == {{STRATEGY_DEPTH_FIRST}}
local unknown = 0
if analysed ~= '' and done > 0 then
  local words, unknown_done = {}, 0
  for word in string.gmatch(analysed, '%S+') do words[#words + 1] = word end
  for j = 1, #words, 2 do
    if redis.call('HDEL', released, words[j]) == 0 then
      unknown, unknown_done = unknown + 1, unknown_done + tonumber(words[j + 1])
    end
  end
  if unknown > 0 and (token == '' or redis.call('SISMEMBER', tokens, token) == 0) then
    if 2 * unknown == #words then return {-3, 0, 0, 0, 0, unknown} end
    done = done - unknown_done
  else
    unknown = 0  -- a repeat of this very call (its token): nothing was lost
  end
end
if token ~= '' and redis.call('SADD', tokens, token) == 0 then
  return {-1, 0, 0, 0, 0}
end
for _ = 1, tonumber(ARGV[7]) do
  redis.call('HINCRBY', meta, ARGV[i], ARGV[i + 1])
  i = i + 2
end
local first_hist = i
i = i + 3 * nhist
local nhosts = tonumber(ARGV[i])
local hosts = {}
for h = 1, nhosts do hosts[h] = ARGV[i + h] end
i = i + nhosts + 1
local delays = KEYS[6 + nseg + nhosts]
local hist, due = KEYS[7 + nseg + nhosts], KEYS[8 + nseg + nhosts]
for j = first_hist, first_hist + 3 * nhist - 1, 3 do
  redis.call('HSET', hist, ARGV[j], ARGV[j + 1])
  redis.call('ZADD', due, ARGV[j + 2], ARGV[j])
end
local running = state == {{STATE_RUNNING}} or state == {{STATE_PAUSED}}  -- a paused job still takes its links
admitted = tonumber(admitted or '0')
seq = tonumber(seq or '0')  -- counted here, written once at the end (a script runs alone)
local fresh, dup, over, known = 0, 0, 0, 0
local touched = {}
local get, set = {}, {}
for j = 1, k do
  get[3 * j - 2] = 'GET'; get[3 * j - 1] = 'u1'
  set[4 * j - 3] = 'SET'; set[4 * j - 2] = 'u1'; set[4 * j] = '1'
end
-- When every new URL will be queued (no history, room under the page limit), the URLs are tested
-- and marked with one BITFIELD per segment (SET returns the old bits), in their order: the same
-- answers as one BITFIELD each, in a fraction of the commands. A record's old bits are then
-- bits_of[rec][first[rec] + 1 .. first[rec] + k]. The arguments are strings, built with a running
-- count and no table per record: Redis turns a Lua number into text at every call, and each table
-- is garbage its collector pays for in later calls.
local bits_of, first = {}, {}
local nrec = math.floor((#ARGV - i) / (5 + k))
if running and history_mode == 0 and admitted + nrec <= max_pages then
  local ops, count, waiting = {}, {}, {}
  local function flush(segi)
    local reply = redis.call('BITFIELD', KEYS[5 + segi], unpack(ops[segi], 1, count[segi]))
    for _, n in ipairs(waiting[segi]) do bits_of[n] = reply end
    ops[segi], count[segi], waiting[segi] = {}, 0, {}
  end
  for n = 1, nrec do
    local at = i + (n - 1) * (5 + k)
    local segi = tonumber(ARGV[at])
    if not ops[segi] then ops[segi], count[segi], waiting[segi] = {}, 0, {} end
    if count[segi] >= 4000 then flush(segi) end  -- within unpack's limit (~8000)
    local o, c, w = ops[segi], count[segi], waiting[segi]
    w[#w + 1] = n
    first[n] = c / 4
    for b = 1, k do
      o[c + 1] = 'SET'; o[c + 2] = 'u1'; o[c + 3] = ARGV[at + 4 + b]; o[c + 4] = '1'
      c = c + 4
    end
    count[segi] = c
  end
  for segi, c in pairs(count) do
    if c > 0 then flush(segi) end
  end
end
local rec = 0
while running and i < #ARGV do  -- the last ARGV is analysed
  rec = rec + 1
  local seg = KEYS[5 + tonumber(ARGV[i])]
  local hi, depth, priority, member = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), ARGV[i + 4]
  for j = 1, k do get[3 * j] = ARGV[i + 4 + j]; set[4 * j - 1] = ARGV[i + 4 + j] end
  i = i + 5 + k
  -- A sitemap to read (its entry carries "s") is no page: the page limit neither counts nor stops it.
  local sitemap = string.find(member, '"s":', 1, true) ~= nil
  -- A URL that will be queued if new is tested and marked in one BITFIELD (SET returns the old
  -- bits); one that may be refused though new (over the limit, or left to its history) is only read.
  local marked = history_mode == 0 and (admitted < max_pages or sitemap)
  local seen = true
  if bits_of[rec] then
    local bits, base = bits_of[rec], first[rec]
    for j = 1, k do
      if bits[base + j] == 0 then seen = false; break end
    end
  else
    local bits = redis.call(marked and 'BITFIELD' or 'BITFIELD_RO', seg, unpack(marked and set or get))
    for j = 1, k do
      if bits[j] == 0 then seen = false; break end
    end
  end
  local url = nil
  if by_priority or (history_mode > 0 and not seen) then url = cjson.decode(member).u end
  if seen then
    dup = dup + 1
    local queued = by_priority and redis.call('HGET', queued_urls, url)
    if queued and redis.call('HINCRBY', inlinks, url, 1) <= {{INLINK_CAP}} then
      -- XX: only while it is still queued (never adds a URL a pump took meanwhile)
      redis.call('ZADD', KEYS[5 + nseg + hi], 'XX', 'INCR', -{{SCORE_INLINK}}, queued)
    end
  elseif history_mode == 2 and redis.call('HEXISTS', hist, url) == 1 then
    known = known + 1
  elseif admitted >= max_pages and not sitemap then
    over = over + 1
    if history_mode > 0 then
      redis.call('HSETNX', hist, url, '[' .. depth .. ']')
      redis.call('ZADD', due, 'LT', 0, url)
    end
  else
    if not marked then redis.call('BITFIELD', seg, unpack(set)) end
    seq = seq + 1
    local score = depth * {{SCORE_DEPTH}} + seq
    if sitemap and (by_priority or lifo) then
      score = {{SCORE_SITEMAP_FIRST}} - seq  -- ahead of every page: its hints come first
    elseif by_priority then
      score = -priority * {{SCORE_HUNDREDTH}} + seq
    elseif lifo then
      score = -depth * {{SCORE_DEPTH}} - seq
    end
    if by_priority then redis.call('HSET', queued_urls, url, member) end
    local queue = touched[hi] or {}  -- queued below: one ZADD per host
    queue[#queue + 1] = score
    queue[#queue + 1] = member
    touched[hi] = queue
    if not sitemap then admitted = admitted + 1 end
    fresh = fresh + 1
  end
end
if not running then
  return {settle(meta, done, now), 0, 0, 0, 0, unknown}
end
-- A host whose queue had URLs before this call is in ready already, or leased up to its slots
-- (its release puts it back): only a queue started here needs its host made ready.
for hi, queue in pairs(touched) do
  local host, q = hosts[hi], KEYS[5 + nseg + hi]
  for from = 1, #queue, 4000 do  -- within unpack's limit (~8000)
    redis.call('ZADD', q, unpack(queue, from, math.min(#queue, from + 3999)))
  end
  if redis.call('ZCARD', q) == #queue / 2 then
    local next_time = redis.call('HGET', nextk, host)
    if not next_time then
      -- never fetched: one request at a time until its robots.txt (and Crawl-delay) is known
      redis.call('HSETNX', delays, host, -1)
    end
    if tonumber(redis.call('HGET', busy, host) or '0') < per_host then
      local not_before = tonumber(next_time or '0')
      if not_before < now then not_before = now end
      redis.call('ZADD', ready, 'NX', not_before, host)
    end
  end
end
if fresh > 0 then
  redis.call('HSET', meta, {{META_ADMITTED}}, admitted, {{META_SEQ}}, seq)
  redis.call('HINCRBY', meta, {{META_QUEUED_NOW}}, fresh)
end
if dup > 0 then redis.call('HINCRBY', meta, {{COUNTER_DUPLICATES}}, dup) end
if over > 0 then redis.call('HINCRBY', meta, {{PREFIX_FILTERED}} .. {{REASON_MAX_PAGES}}, over) end
if known > 0 then redis.call('HINCRBY', meta, {{COUNTER_NOT_DUE}}, known) end
-- The fresh URLs join the pending ones as the done ones leave: one step (settle, _common.lua).
return {settle(meta, done - fresh, now), fresh, dup, over, known, unknown}
