"""The Mercator-style frontier in Redis: per-host queues and a ready-time heap of hosts.

A job's URLs wait in one sorted set per host (breadth-first: score = depth, then arrival).
A host is in the job's ``ready`` heap, scored with the time it may next be fetched,
while it has queued URLs and a free slot. Pumps pop due hosts atomically (Lua), lease
their URLs as a batch, and the fetch that ran the batch releases the lease, which sets
the host's next time. Every state change is one script, so any number of pumps and
workers on any number of machines keep it exact. All of a job's keys share one hash
tag, so the scripts also work on a Redis Cluster.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from frontier.dedup import BloomFilter
from frontier.history import UrlHistory
from vcrawl import redis_keys

__all__ = ["Admission", "Batch", "Candidate", "CycleStart", "Entry", "Frontier", "PumpResult"]

# Score = depth * _DEPTH_WEIGHT + arrival sequence: breadth-first, FIFO within a depth.
_DEPTH_WEIGHT = 1e12
_BACK_OF_QUEUE = 1000 * _DEPTH_WEIGHT  # deeper than any depth a job allows

# Every script reads the clock of the Redis server (TIME), so workers and pumps on machines
# whose clocks differ still agree on when a host is due.
_COMMON = """
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function settle(meta, done, now)
  local pending = redis.call('HINCRBY', meta, 'pending', 0 - done)
  if pending <= 0 and redis.call('HGET', meta, 'state') == 'running' then
    redis.call('HSET', meta, 'state', 'completed', 'finished_at', now / 1000)
    return 1
  end
  return 0
end
"""

# KEYS: meta, ready, next, busy, done_tokens, segment(1..s), queue(host_1..host_n), delays, hist, due
# ARGV: max_pages, per_host, done, token, hashes, n_segments, n_counters, history_mode, cycle,
#       n_history, [field, incr]*, [url, record, due_s]*, n_hosts, [host]*, then per URL:
#       [segment_index, host_index, depth, member, offset * hashes]
# A URL is admitted only if the Bloom filter has not seen it; both happen in this one script,
# so no URL can be marked seen without being queued. ``token`` makes a retried call a no-op.
# history_mode (scheduled jobs): 0 none; 1 a URL over the page limit is kept in the history as
# due, so a later cycle fetches it; 2 as 1, and a URL the history knows is left to its due time
# (a link to it from a changed page does not fetch it early). A call for another cycle than the
# job's current one does nothing (a late analysis of a finished cycle); the history records of
# the pages it finishes are written in the same step, so no cycle ends before they are.
_ADMIT = (
    _COMMON
    + """
local meta, ready, nextk, busy, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = clock_ms()
local max_pages, per_host, done = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local token, k, nseg = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local history_mode, cycle, nhist = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local i = 11
if cycle > 0 and tonumber(redis.call('HGET', meta, 'cycle') or '0') ~= cycle then
  -- A late analysis of an earlier cycle: its pages are not lost, they are due in a later cycle.
  local nhosts_at = i + 2 * tonumber(ARGV[7]) + 3 * nhist
  local hist, due = KEYS[7 + nseg + tonumber(ARGV[nhosts_at])], KEYS[8 + nseg + tonumber(ARGV[nhosts_at])]
  for j = i + 2 * tonumber(ARGV[7]), nhosts_at - 1, 3 do
    redis.call('HSETNX', hist, ARGV[j], '[' .. cjson.decode(ARGV[j + 1])[1] .. ']')
    redis.call('ZADD', due, 'LT', 0, ARGV[j])
  end
  return {-2, 0, 0, 0, 0}
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
local state = redis.call('HGET', meta, 'state')
local running = state == 'running' or state == 'paused'  -- a paused job still takes its links
local admitted = tonumber(redis.call('HGET', meta, 'admitted') or '0')
local fresh, dup, over, known = 0, 0, 0, 0
local touched = {}
local get, set = {}, {}
for j = 1, k do
  get[3 * j - 2] = 'GET'; get[3 * j - 1] = 'u1'
  set[4 * j - 3] = 'SET'; set[4 * j - 2] = 'u1'; set[4 * j] = 1
end
while running and i <= #ARGV do
  local seg = KEYS[5 + tonumber(ARGV[i])]
  local hi, depth, member = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  for j = 1, k do get[3 * j] = ARGV[i + 3 + j]; set[4 * j - 1] = ARGV[i + 3 + j] end
  i = i + 4 + k
  local bits = redis.call('BITFIELD_RO', seg, unpack(get))
  local seen = true
  for j = 1, k do
    if bits[j] == 0 then seen = false; break end
  end
  local url = nil
  if history_mode > 0 and not seen then url = cjson.decode(member).u end
  if seen then
    dup = dup + 1
  elseif history_mode == 2 and redis.call('HEXISTS', hist, url) == 1 then
    known = known + 1
  elseif admitted >= max_pages then
    over = over + 1
    if history_mode > 0 then
      redis.call('HSETNX', hist, url, '[' .. depth .. ']')
      redis.call('ZADD', due, 'LT', 0, url)
    end
  else
    redis.call('BITFIELD', seg, unpack(set))
    local seq = redis.call('HINCRBY', meta, 'seq', 1)
    redis.call('ZADD', KEYS[5 + nseg + hi], depth * 1e12 + seq, member)
    admitted = admitted + 1
    fresh = fresh + 1
    touched[hi] = true
  end
end
if not running then
  return {settle(meta, done, now), 0, 0, 0, 0}
end
for hi, _ in pairs(touched) do
  local host = hosts[hi]
  if redis.call('HEXISTS', nextk, host) == 0 then
    -- never fetched: one request at a time until its robots.txt (and Crawl-delay) is known
    redis.call('HSETNX', delays, host, -1)
  end
  if tonumber(redis.call('HGET', busy, host) or '0') < per_host then
    local not_before = tonumber(redis.call('HGET', nextk, host) or '0')
    if not_before < now then not_before = now end
    redis.call('ZADD', ready, 'NX', not_before, host)
  end
end
redis.call('HSET', meta, 'admitted', admitted)
redis.call('HINCRBY', meta, 'pending', fresh)
redis.call('HINCRBY', meta, 'queued_now', fresh)
if dup > 0 then redis.call('HINCRBY', meta, 'duplicates', dup) end
if over > 0 then redis.call('HINCRBY', meta, 'filtered:max_pages', over) end
if known > 0 then redis.call('HINCRBY', meta, 'not_due', known) end
return {settle(meta, done, now), fresh, dup, over, known}
"""
)

# KEYS: meta, ready, busy, leases, delays
# ARGV: max_batches, batch_size, per_host, interval_ms, lease_ms, cap, qprefix
# A host with a robots.txt Crawl-delay (or not yet fetched) gets one URL at a time, one batch
# at a time. Otherwise a host with a free slot stays in the heap, due again after the interval.
# Returns {next due, now, cycle, then per batch: id, host, entries, paced}; paced is '1' when the
# host waits between requests (a Crawl-delay, robots.txt unknown, or the job's interval).
_PUMP = (
    _COMMON
    + """
local meta, ready, busy, leases, delays = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = clock_ms()
local max_batches, batch_size, per_host = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local interval, lease_ms, cap, qprefix = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local out = {'-1', tostring(now), redis.call('HGET', meta, 'cycle') or '0'}
if redis.call('HGET', meta, 'state') ~= 'running' then
  out[1] = 'stopped'
  return out
end
local room = cap - redis.call('HLEN', leases)
if room > max_batches then room = max_batches end
if room > 0 then
  local hosts = redis.call('ZRANGEBYSCORE', ready, '-inf', now, 'LIMIT', 0, room)
  for _, host in ipairs(hosts) do
    local q = qprefix .. host
    local inflight = tonumber(redis.call('HGET', busy, host) or '0')
    local slots, size, paced = per_host, batch_size, '0'
    if redis.call('HEXISTS', delays, host) == 1 then
      slots, size, paced = 1, 1, '1'
    end
    if inflight >= slots then
      redis.call('ZREM', ready, host)
    else
      local popped = redis.call('ZPOPMIN', q, size)
      if #popped == 0 then
        redis.call('ZREM', ready, host)
      else
        local entries = {}
        for j = 1, #popped, 2 do entries[#entries + 1] = popped[j] end
        local id = redis.call('HINCRBY', meta, 'batch_seq', 1)
        redis.call('HINCRBY', busy, host, 1)
        redis.call('HSET', leases, id, cjson.encode({h = host, e = entries, t = now + lease_ms}))
        redis.call('HINCRBY', meta, 'queued_now', -#entries)
        redis.call('HINCRBY', meta, 'dispatched', #entries)
        if inflight + 1 < slots and redis.call('ZCARD', q) > 0 then
          redis.call('ZADD', ready, now + interval, host)
        else
          redis.call('ZREM', ready, host)
        end
        out[#out + 1] = tostring(id)
        out[#out + 1] = host
        out[#out + 1] = cjson.encode(entries)
        out[#out + 1] = (paced == '1' or interval > 0) and '1' or '0'
      end
    end
  end
end
local first = redis.call('ZRANGE', ready, 0, 0, 'WITHSCORES')
if #first > 0 then out[1] = first[2] end
return out
"""
)

# KEYS: meta, leases   ARGV: batch_id, lease_ms
# Returns 1 (go on: the lease now runs from here), 0 (the lease is gone: a stale message),
# 2 (the job is not running: give the batch back).
_START = (
    _COMMON
    + """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 2 end
local lease = cjson.decode(raw)
local now = clock_ms()
lease.s = now
lease.t = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode(lease))
return 1
"""
)

# KEYS: meta, ready, next, busy, leases, queue(host), delays, hist, due, stats bucket, host stats,
#       failures, released
# ARGV: batch_id, host, pause_ms, host_delay_ms, done, crawl_delay_ms, n_requeue, n_history,
#       bucket_ttl_s, n_failures, host_done, handed_on, [score, member]*, [url, record, due_s]*,
#       [failure json]*, [field, incr]*
# handed_on: what the batch hands to its analysis (JSON, '' for nothing), kept in ``released``
# until the analysis has admitted it: a worker killed after this release but before it sent the
# analysis gets its fetch message again, finds the lease gone, and sends this instead.
# host_done: URLs of the batch taken to an end here, incl. pages handed on to analysis.
# History records (scheduled jobs: URLs found unchanged or failed) are written with the release
# that finishes them, so a cycle never completes before they are. The counters also go to the
# job's per-minute bucket and the host's totals; final failures to the job's recent failures.
# The host's next time: a pause after the batch started, never before it ended, and later
# still when the host asked to be left alone (host_delay_ms from now).
_RELEASE = (
    _COMMON
    + """
local meta, ready, nextk, busy, leases, q = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, host, pause, host_delay = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local done, delay, nreq, nhist = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local raw = redis.call('HGET', leases, id)
if not raw then
  return -1
end
redis.call('HDEL', leases, id)
local now = clock_ms()
local started = cjson.decode(raw).s or now
local nxt = math.max(now, started + pause, now + host_delay)
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
local i = 13
for _ = 1, nreq do
  redis.call('ZADD', q, ARGV[i], ARGV[i + 1])
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
redis.call('HINCRBY', meta, 'queued_now', nreq)
if host_done > 0 then redis.call('HINCRBY', KEYS[11], 'done|' .. host, host_done) end
redis.call('HSET', meta, 'progress_at', now / 1000)
local counted = false
while i <= #ARGV do
  local name, incr = ARGV[i], tonumber(ARGV[i + 1])
  redis.call('HINCRBY', meta, name, incr)
  redis.call('HINCRBY', KEYS[10], name, incr)
  counted = true
  if name == 'fetched' then
    redis.call('HINCRBY', KEYS[11], 'fetched|' .. host, incr)
  elseif string.sub(name, 1, 7) == 'failed:' then
    redis.call('HINCRBY', KEYS[11], 'failed|' .. host, incr)
  end
  i = i + 2
end
if counted then redis.call('EXPIRE', KEYS[10], bucket_ttl) end
redis.call('HSET', nextk, host, nxt)
local state = redis.call('HGET', meta, 'state')
if redis.call('ZCARD', q) > 0 and (state == 'running' or state == 'paused') then
  redis.call('ZADD', ready, 'GT', nxt, host)
end
return settle(meta, done, now)
"""
)

# KEYS: meta, ready, next, busy, leases   ARGV: qprefix, max_attempts, interval_ms
# A lease that ran out: its worker died (or its message was lost). Its URLs go back to the
# front of their host's queue with one more attempt, or fail once they had enough.
_RECLAIM = (
    _COMMON
    + """
local meta, ready, nextk, busy, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local qprefix, max_attempts, interval = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock_ms()
local all = redis.call('HGETALL', leases)
local back, failed = 0, 0
for j = 1, #all, 2 do
  local lease = cjson.decode(all[j + 1])
  if lease.t < now then
    redis.call('HDEL', leases, all[j])
    local requeued = 0
    for _, member in ipairs(lease.e) do
      local entry = cjson.decode(member)
      entry.a = entry.a + 1
      if entry.a > max_attempts then
        failed = failed + 1
      else
        redis.call('ZADD', qprefix .. lease.h, entry.d * 1e12, cjson.encode(entry))
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
    back = back + requeued
  end
end
if back > 0 then
  redis.call('HINCRBY', meta, 'queued_now', back)
  redis.call('HINCRBY', meta, 'lease_expired', back)
end
if failed > 0 then
  redis.call('HINCRBY', meta, 'failed:lease_expired', failed)
end
settle(meta, failed, now)
return {back, failed}
"""
)

# KEYS: meta, ready, next, busy, leases, tokens, hist, due, todo, cycles, delays, bloom segment*
# ARGV: firing, spec_json, overlap ('skip' | 'cancel'), qprefix, cycles_kept
# Starts the next cycle of a scheduled job: archives the last cycle's counters, clears what
# was per cycle (queues, leases, Bloom filter, tokens), keeps what carries over (history, due
# times, hosts' next times and Crawl-delays), and copies the URLs due now into ``todo``.
# ``pending`` starts at 1, held by the starter until all seeds and due URLs are admitted.
_NEW_CYCLE = (
    _COMMON
    + """
local meta, ready, nextk, busy, leases, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local hist, due, todo, cycles = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local firing, spec, overlap, qprefix, kept = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local now = clock_ms()
local cycle = tonumber(redis.call('HGET', meta, 'cycle') or '0')
local state = redis.call('HGET', meta, 'state')
-- The same firing again (redelivered), or any firing while a start never finished: finish it.
local active = state == 'running' or state == 'paused'
if redis.call('HGET', meta, 'firing') == firing or (active and redis.call('HGET', meta, 'starting')) then
  return {'resumed', cycle, redis.call('ZCARD', todo)}
end
if state and cycle == 0 then
  return {'one-off', 0, 0}
end
if active then
  if overlap == 'skip' then
    redis.call('HINCRBY', meta, 'skipped_firings', 1)
    redis.call('HSET', meta, 'last_skipped_at', now / 1000)
    return {'skipped', cycle, 0}
  end
  state = 'cancelled'
  redis.call('HSET', meta, 'finished_at', now / 1000)
end
local carried = {spec = 1, seq = 1, batch_seq = 1, cycle = 1, created_at = 1, skipped_firings = 1,
                 last_skipped_at = 1, firing = 1, spec_rev = 1}
local all = redis.call('HGETALL', meta)
local summary = {cycle = cycle, state = state, counters = {}}
local drop = {}
for j = 1, #all, 2 do
  local name, value = all[j], all[j + 1]
  if not carried[name] then
    drop[#drop + 1] = name
    if name == 'started_at' or name == 'finished_at' then
      summary[name] = tonumber(value)
    elseif name ~= 'state' then
      summary.counters[name] = tonumber(value)
    end
  end
end
if cycle > 0 then
  redis.call('RPUSH', cycles, cjson.encode(summary))
  redis.call('LTRIM', cycles, -kept, -1)
end
if #drop > 0 then redis.call('HDEL', meta, unpack(drop)) end
-- URLs a cancelled cycle left queued or leased are due at once in the next one.
local function keep_for_later(member)
  local entry = cjson.decode(member)
  redis.call('HSETNX', hist, entry.u, '[' .. entry.d .. ']')
  redis.call('ZADD', due, 'LT', 0, entry.u)
end
local hosts = {}
for _, h in ipairs(redis.call('ZRANGE', ready, 0, -1)) do hosts[h] = true end
for _, h in ipairs(redis.call('HKEYS', busy)) do hosts[h] = true end
for _, h in ipairs(redis.call('HKEYS', nextk)) do hosts[h] = true end
for _, h in ipairs(redis.call('HKEYS', KEYS[11])) do hosts[h] = true end
for h, _ in pairs(hosts) do
  local q = qprefix .. h
  for _, member in ipairs(redis.call('ZRANGE', q, 0, -1)) do keep_for_later(member) end
  redis.call('DEL', q)
end
for _, raw in ipairs(redis.call('HVALS', leases)) do
  for _, member in ipairs(cjson.decode(raw).e) do keep_for_later(member) end
end
redis.call('DEL', ready, busy, leases, tokens, todo)
for j = 12, #KEYS do redis.call('DEL', KEYS[j]) end
redis.call('HSET', meta, 'spec', spec, 'state', 'running', 'cycle', cycle + 1, 'started_at', now / 1000,
           'firing', firing, 'pending', 1, 'admitted', 0, 'queued_now', 0, 'starting', 1)
redis.call('HSETNX', meta, 'created_at', now / 1000)
local taken = redis.call('ZRANGESTORE', todo, due, '-inf', now / 1000, 'BYSCORE')
return {'started', cycle + 1, taken}
"""
)

# KEYS: meta, todo   ARGV: cycle
_FINISH_START = """
if redis.call('HGET', KEYS[1], 'cycle') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'starting')
  redis.call('DEL', KEYS[2])
end
return 1
"""

# KEYS: meta, then the job's Bloom filter segments. A finished job's filter goes (megabytes
# each); a paused or restarted one keeps it, checked here so a new cycle's filter is safe.
_DROP_FILTER = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'completed' and state ~= 'cancelled' then return 0 end
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
"""

_CANCEL = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'running' and state ~= 'paused' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'cancelled', 'finished_at', ARGV[1])
return 1
"""

# KEYS: meta   ARGV: spec_json
_UPDATE_SPEC = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'running' and state ~= 'paused' then return false end
redis.call('HSET', KEYS[1], 'spec', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'spec_rev', 1)
"""

# KEYS: meta   ARGV: now_s
# Paused: nothing is dispatched; batches not yet started are handed back unfetched, a running
# batch stops before its next URL; links found meanwhile are still admitted (queued).
_PAUSE = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'paused', 'paused_at', ARGV[1])
return 1
"""

# KEYS: meta   Returns 0 (not paused), 1 (running again), 2 (nothing was left: completed).
_RESUME = (
    _COMMON
    + """
local meta = KEYS[1]
if redis.call('HGET', meta, 'state') ~= 'paused' then return 0 end
redis.call('HSET', meta, 'state', 'running')
redis.call('HDEL', meta, 'paused_at')
return 1 + settle(meta, 0, clock_ms())
"""
)


@dataclass(frozen=True)
class Entry:
    """A URL waiting in the frontier: canonical URL, depth, attempts so far, redirects left."""

    url: str
    depth: int = 0
    attempt: int = 0
    redirects_left: int = 5
    not_before_s: float = 0.0  # a retry waiting for its Retry-After (epoch seconds); 0: fetch when leased

    def encode(self) -> str:
        """Compact JSON; the frontier moves these strings around without parsing them."""
        data: dict[str, object] = {"u": self.url, "d": self.depth, "a": self.attempt, "r": self.redirects_left}
        if self.not_before_s:
            data["n"] = round(self.not_before_s, 3)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Entry:
        """Inverse of ``encode``."""
        data = json.loads(text)
        not_before_s = float(data["n"]) if "n" in data else 0.0
        if not math.isfinite(not_before_s):
            raise ValueError(f"Entry.not_before_s must be finite, got {not_before_s!r}")
        return cls(data["u"], data["d"], data["a"], data["r"], not_before_s)


@dataclass(frozen=True)
class Candidate:
    """A canonical URL that passed the filters, with its frontier host key."""

    host: str
    entry: Entry


@dataclass(frozen=True)
class Admission:
    """What an admission call did."""

    completed: bool
    repeated: bool
    admitted: int
    duplicates: int
    over_limit: int
    not_due: int = 0


@dataclass(frozen=True)
class Batch:
    """URLs of one host leased to one fetch task."""

    batch_id: str
    host: str
    entries: tuple[Entry, ...]
    cycle: int = 0  # a scheduled job's cycle; 0 for a one-off job
    paced: bool = False  # the host waits between requests (interval, Crawl-delay): late = slower

    def to_dict(self) -> dict[str, object]:
        """The JSON form carried by a fetch message."""
        entries = [entry.encode() for entry in self.entries]
        data: dict[str, object] = {"id": self.batch_id, "host": self.host, "entries": entries}
        if self.cycle:
            data["cycle"] = self.cycle
        if self.paced:
            data["paced"] = True
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Batch:
        """Inverse of ``to_dict``.

        Raises:
            ValueError: a malformed batch.
        """
        try:
            entries = tuple(Entry.decode(text) for text in data["entries"])  # type: ignore[union-attr]
            paced = data.get("paced", False)
            if not isinstance(paced, bool):
                raise ValueError(f"Batch.paced must be true or false, got {paced!r}")
            return cls(str(data["id"]), str(data["host"]), entries, int(data.get("cycle", 0)), paced)  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise ValueError(f"malformed batch: {exc}") from None


@dataclass(frozen=True)
class PumpResult:
    """What one pump call dispatched, and in how many seconds the next host is due (None: none)."""

    batches: tuple[Batch, ...]
    next_due_s: float | None
    stopped: bool = False


@dataclass(frozen=True)
class CycleStart:
    """What ``Frontier.new_cycle`` did: ``started``, ``resumed`` (same firing again) or ``skipped``
    (the previous cycle still runs), the cycle number, and how many known URLs were due."""

    status: str
    cycle: int
    due: int


class Frontier:
    """The scripts over a job's frontier keys; one instance per process is enough."""

    def __init__(self, client: redis.Redis, stats_ttl_s: int = 3 * 86400) -> None:
        self._redis = client
        self._stats_ttl_s = stats_ttl_s  # how long per-minute statistics are kept
        self._admit = client.register_script(_ADMIT)
        self._pump = client.register_script(_PUMP)
        self._start = client.register_script(_START)
        self._release = client.register_script(_RELEASE)
        self._reclaim = client.register_script(_RECLAIM)
        self._cancel = client.register_script(_CANCEL)
        self._drop_filter = client.register_script(_DROP_FILTER)
        self._new_cycle = client.register_script(_NEW_CYCLE)
        self._finish_start = client.register_script(_FINISH_START)
        self._pause = client.register_script(_PAUSE)
        self._update_spec = client.register_script(_UPDATE_SPEC)
        self._resume = client.register_script(_RESUME)

    def create(self, job_id: str, spec_json: str, now: float) -> bool:
        """Record a new running job; False if the id is taken."""
        meta = redis_keys.job(job_id)
        if not self._redis.hsetnx(meta, "spec", spec_json):
            return False
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(meta, mapping={"state": "running", "created_at": now, "pending": 0, "admitted": 0})
        pipe.zadd(redis_keys.JOBS, {job_id: now})
        pipe.sadd(redis_keys.JOBS_RUNNING, job_id)
        pipe.execute()
        return True

    def new_cycle(
        self,
        job_id: str,
        spec_json: str,
        *,
        firing: str,
        overlap: str = "skip",
        bloom_keys: Sequence[str] = (),
        cycles_kept: int = 100,
    ) -> CycleStart:
        """Start the next cycle of a scheduled job (creating the job on its first firing).

        ``firing`` identifies the schedule's firing: the same firing again resumes the cycle it
        started (a redelivered start). A firing while a cycle runs is skipped and counted, or with
        ``overlap="cancel"`` cancels that cycle first. ``bloom_keys``: the Bloom segments to clear.
        """
        keys = [
            *_job_keys(job_id, "meta", "ready", "next", "busy", "leases"),
            redis_keys.job_admit_tokens(job_id),
            redis_keys.job_history(job_id),
            redis_keys.job_due(job_id),
            redis_keys.job_todo(job_id),
            redis_keys.job_cycles(job_id),
            redis_keys.job_delays(job_id),
            *bloom_keys,
        ]
        args = [firing, spec_json, overlap, redis_keys.job_queue_prefix(job_id), cycles_kept]
        status, cycle, due = self._new_cycle(keys=keys, args=args)
        result = CycleStart(_text(status), int(cycle), int(due))
        if result.status in ("started", "resumed"):
            pipe = self._redis.pipeline(transaction=False)
            pipe.zadd(redis_keys.JOBS, {job_id: float(self._redis.hget(redis_keys.job(job_id), "created_at") or 0)})
            pipe.sadd(redis_keys.JOBS_RUNNING, job_id)
            pipe.execute()
        return result

    def cycle(self, job_id: str) -> int:
        """The job's current cycle (0: a one-off job)."""
        return int(self._redis.hget(redis_keys.job(job_id), "cycle") or 0)

    def cycles(self, job_id: str) -> list[dict[str, object]]:
        """Summaries of the job's finished cycles, oldest first."""
        return [json.loads(raw) for raw in self._redis.lrange(redis_keys.job_cycles(job_id), 0, -1)]

    def finish_start(self, job_id: str, cycle: int) -> None:
        """Mark the start of ``cycle`` done (its seeds and due URLs are all admitted)."""
        self._finish_start(keys=[redis_keys.job(job_id), redis_keys.job_todo(job_id)], args=[cycle])

    def admit(
        self,
        job_id: str,
        candidates: Sequence[Candidate],
        *,
        bloom: BloomFilter,
        max_pages: int,
        per_host: int,
        done: int = 0,
        token: str = "",
        counters: Mapping[str, int] | None = None,
        history_mode: int = 0,
        cycle: int = 0,
        history: Mapping[str, UrlHistory] | None = None,
        analysed_batch: str | None = None,
    ) -> Admission:
        """Dedup and queue candidates, apply counters, mark ``done`` URLs finished: one round trip.

        ``analysed_batch``: the fetch batch this call finishes; what its release kept for a
        lost analysis is dropped in the same round trip.

        A call with a ``token`` seen before does nothing (a retried task admits once).
        ``history_mode`` is for scheduled jobs (see the script): 1 for seeds and due URLs,
        2 for links found on pages. A ``cycle`` other than the job's current one makes the call a
        no-op (reported as ``repeated``); ``history`` records are written in the same step.
        """
        hosts: dict[str, int] = {}
        segments: dict[str, int] = {}
        items: list[str | int | float] = []
        for candidate in candidates:
            segment, offsets = bloom.locate(candidate.entry.url)
            key = bloom.keys[segment]
            items.extend(
                (
                    segments.setdefault(key, len(segments) + 1),
                    hosts.setdefault(candidate.host, len(hosts) + 1),
                    candidate.entry.depth,
                    candidate.entry.encode(),
                    *offsets,
                )
            )
        counter_args = _counter_args(counters)
        keys = [*_job_keys(job_id, "meta", "ready", "next", "busy"), redis_keys.job_admit_tokens(job_id)]
        keys.extend(segments)
        keys.extend(redis_keys.job_queue(job_id, host) for host in hosts)
        keys.extend((redis_keys.job_delays(job_id), redis_keys.job_history(job_id), redis_keys.job_due(job_id)))
        history_args = _history_args(history)
        args = [max_pages, per_host, done, token, bloom.hashes, len(segments), len(counter_args) // 2, history_mode]
        args.extend((cycle, len(history_args) // 3))
        args.extend(counter_args)
        args.extend(history_args)
        args.append(len(hosts))
        args.extend(hosts)
        args.extend(items)
        also = [] if analysed_batch is None else [("HDEL", redis_keys.job_released(job_id), analysed_batch)]
        reply = self._with_wake(self._admit, keys, args, wake=bool(candidates), also=also)
        completed, fresh, duplicates, over, known = (int(x) for x in reply)
        # A completed job leaves the running set on the next pump round (forget_if_stopped).
        return Admission(completed == 1, completed < 0, fresh, duplicates, over, known)  # -2: another cycle

    def pump(
        self,
        job_id: str,
        *,
        max_batches: int,
        batch_size: int,
        per_host: int,
        interval_ms: float,
        lease_ms: float,
        cap: int,
    ) -> PumpResult:
        """Lease due hosts' URLs as batches (at most ``cap`` batches in flight per job)."""
        raw = self._pump(
            keys=list(_job_keys(job_id, "meta", "ready", "busy", "leases", "delays")),
            args=[max_batches, batch_size, per_host, interval_ms, lease_ms, cap, redis_keys.job_queue_prefix(job_id)],
        )
        head, now, cycle = _text(raw[0]), float(_text(raw[1])), int(_text(raw[2]))
        if head == "stopped":
            return PumpResult((), None, stopped=True)
        batches = tuple(
            Batch(
                _text(raw[i]),
                _text(raw[i + 1]),
                tuple(Entry.decode(e) for e in json.loads(_text(raw[i + 2]))),
                cycle,
                paced=_text(raw[i + 3]) == "1",
            )
            for i in range(3, len(raw), 4)
        )
        next_due = float(head)
        return PumpResult(batches, None if next_due < 0 else (next_due - now) / 1000)

    def start_lease(self, job_id: str, batch_id: str, lease_ms: float) -> str:
        """Mark a batch as started: ``"go"`` (its lease now runs from here), ``"stale"`` (the lease
        ran out and its URLs were requeued: do nothing) or ``"stopped"`` (the job is not running).
        """
        code = int(self._start(keys=[redis_keys.job(job_id), redis_keys.job_leases(job_id)], args=[batch_id, lease_ms]))
        return {0: "stale", 1: "go", 2: "stopped"}[code]

    def release(
        self,
        job_id: str,
        batch: Batch,
        *,
        pause_ms: float,
        host_delay_ms: float = 0.0,
        done: int,
        requeue: Sequence[Entry] = (),
        requeue_back: Sequence[Entry] = (),
        counters: Mapping[str, int] | None = None,
        crawl_delay_s: float | None = None,
        history: Mapping[str, UrlHistory] | None = None,
        failures: Sequence[Mapping[str, object]] = (),
        host_done: int = 0,
        fetched: bool = True,
        handed_on: str = "",
    ) -> bool | None:
        """End a batch's lease: requeue entries, count, set the host's next time.

        The host is due again ``pause_ms`` after the batch started (see ``start_lease``), never
        before now, and not before ``host_delay_ms`` from now. ``crawl_delay_s`` is what the
        batch's fetches found (None: no Crawl-delay); a batch that ``fetched`` nothing leaves
        what is known about the host as it is. Returns True if this completed the job, False if
        not, None if the lease was gone (reclaimed: nothing is counted twice).
        """
        requeue_args: list[str | float] = []
        for entry in requeue:  # at the front of their depth: next in line
            requeue_args.extend((entry.depth * _DEPTH_WEIGHT, entry.encode()))
        for entry in requeue_back:  # behind everything the host has queued
            requeue_args.extend((_BACK_OF_QUEUE + entry.depth * _DEPTH_WEIGHT, entry.encode()))
        keys = [
            *_job_keys(job_id, "meta", "ready", "next", "busy", "leases"),
            redis_keys.job_queue(job_id, batch.host),
            redis_keys.job_delays(job_id),
            redis_keys.job_history(job_id),
            redis_keys.job_due(job_id),
            redis_keys.job_stats_bucket(job_id, stats_minute(time.time())),
            redis_keys.job_host_stats(job_id),
            redis_keys.job_failures(job_id),
            redis_keys.job_released(job_id),
        ]
        delay_ms = int((crawl_delay_s or 0) * 1000) if fetched else -1
        history_args = _history_args(history)
        args = [batch.batch_id, batch.host, int(pause_ms), int(host_delay_ms), done, delay_ms]
        args.extend((len(requeue) + len(requeue_back), len(history_args) // 3))
        args.extend((self._stats_ttl_s, len(failures), host_done, handed_on))
        args.extend(requeue_args)
        args.extend(history_args)
        args.extend(json.dumps(failure, separators=(",", ":")) for failure in failures)
        args.extend(_counter_args(counters))
        # A finished batch frees a slot (and maybe requeued URLs): wake a waiting pump.
        result = int(self._with_wake(self._release, keys, args, wake=True))
        return None if result < 0 else result == 1  # completed: the pump forgets it next round

    def _with_wake(
        self, script: Script, keys: list[str], args: list[Any], *, wake: bool, also: Sequence[tuple[Any, ...]] = ()
    ) -> Any:
        """Run ``script`` and (with ``wake``) wake a waiting pump: one round trip; the script's result.

        The wake-up list is not one of the job's keys (they share a hash tag; it is global), so it
        is pipelined, not written by the script. redis-py would check with SCRIPT EXISTS before
        every pipeline that runs a script, one more round trip each time; here a missing script
        (Redis restarted empty, or flushed) is loaded once and the pipeline sent again.
        """
        for attempt in (1, 2):
            pipe = self._redis.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if wake:
                pipe.lpush(redis_keys.FRONTIER_WAKE, 1)
                pipe.ltrim(redis_keys.FRONTIER_WAKE, 0, 63)
            for command in also:
                pipe.execute_command(*command)
            try:
                return pipe.execute()[0]
            except NoScriptError:
                if attempt == 2:
                    raise
                self._redis.script_load(script.script)
        raise AssertionError("unreachable")

    def handed_on(self, job_id: str, batch_id: str) -> dict[str, Any] | None:
        """What a released batch handed to its analysis, while that analysis has not admitted it."""
        raw = self._redis.hget(redis_keys.job_released(job_id), batch_id)
        return None if raw is None else json.loads(raw)

    def reclaim_expired(self, job_id: str, max_attempts: int, interval_ms: float) -> tuple[int, int]:
        """Requeue the URLs of batches whose lease ran out; fail those out of attempts.

        Returns (requeued, failed).
        """
        requeued, failed = self._reclaim(
            keys=list(_job_keys(job_id, "meta", "ready", "next", "busy", "leases")),
            args=[redis_keys.job_queue_prefix(job_id), max_attempts, interval_ms],
        )
        return int(requeued), int(failed)

    def cancel(self, job_id: str, now: float) -> bool:
        """Stop dispatching a running job at once (``now`` in seconds); False if it was not running."""
        # It stays in the running set: the next pump round sees it stopped and forgets it,
        # dropping its Bloom filter, which only the pump knows the keys of.
        return int(self._cancel(keys=[redis_keys.job(job_id)], args=[now])) == 1

    def update_spec(self, job_id: str, spec_json: str) -> int | None:
        """Replace a running or paused job's spec; return its new revision (None: not running).

        Workers pick the new spec up within ``RuntimeCache``'s recheck time.
        """
        return _int_or_none(self._update_spec(keys=[redis_keys.job(job_id)], args=[spec_json]))

    def spec_rev(self, job_id: str) -> int:
        """How many times the job's spec was changed while it ran."""
        return int(self._redis.hget(redis_keys.job(job_id), "spec_rev") or 0)

    def stats(self, job_id: str, minutes: int, now: float) -> list[tuple[int, dict[str, int]]]:
        """The job's per-minute counters over the last ``minutes`` minutes, oldest first."""
        last = int(now // 60)
        pipe = self._redis.pipeline(transaction=False)
        for minute in range(last - minutes + 1, last + 1):
            pipe.hgetall(redis_keys.job_stats_bucket(job_id, minute))
        rows = pipe.execute()
        return [
            (minute, {_text(k): int(v) for k, v in row.items()})
            for minute, row in zip(range(last - minutes + 1, last + 1), rows, strict=True)
        ]

    def host_stats(self, job_id: str) -> dict[str, dict[str, int]]:
        """Per host: responses (``fetched``), URLs finished (``done``) and final failures (``failed``)."""
        hosts: dict[str, dict[str, int]] = {}
        for field, value in self._redis.hgetall(redis_keys.job_host_stats(job_id)).items():
            kind, host = _text(field).split("|", 1)
            hosts.setdefault(host, {"fetched": 0, "done": 0, "failed": 0})[kind] = int(value)
        return hosts

    def stalled_s(self, job_id: str, now: float) -> float:
        """Seconds a running job with work left has gone without finishing a fetch batch (0 otherwise)."""
        fields = ["state", "pending", "progress_at", "started_at", "created_at"]
        state, pending, *times = self._redis.hmget(redis_keys.job(job_id), fields)
        if _text(state) != "running" or int(pending or 0) <= 0:
            return 0.0
        return max(0.0, now - max(float(t) for t in times if t is not None))

    def host_totals(self, job_id: str, host: str) -> tuple[int, int]:
        """(URLs finished, final failures) of one host in the job."""
        done, failed = self._redis.hmget(redis_keys.job_host_stats(job_id), [f"done|{host}", f"failed|{host}"])
        return int(done or 0), int(failed or 0)

    def failures(self, job_id: str, limit: int = 50) -> list[dict[str, object]]:
        """The job's most recent final failures, newest first."""
        return [json.loads(raw) for raw in self._redis.lrange(redis_keys.job_failures(job_id), 0, limit - 1)]

    def jobs(self, limit: int = 100) -> list[str]:
        """Job ids, newest first."""
        return [_text(job) for job in self._redis.zrevrange(redis_keys.JOBS, 0, limit - 1)]

    def pause(self, job_id: str, now: float) -> bool:
        """Stop dispatching a running job until ``resume``; False if it was not running."""
        paused = int(self._pause(keys=[redis_keys.job(job_id)], args=[now])) == 1
        self._redis.srem(redis_keys.JOBS_RUNNING, job_id)
        return paused

    def resume(self, job_id: str) -> str | None:
        """Dispatch a paused job again: ``"running"``, ``"completed"`` (nothing was left), or
        None if it was not paused."""
        code = int(self._resume(keys=[redis_keys.job(job_id)]))
        if code == 1:
            pipe = self._redis.pipeline(transaction=False)
            pipe.sadd(redis_keys.JOBS_RUNNING, job_id)
            pipe.lpush(redis_keys.FRONTIER_WAKE, 1)
            pipe.ltrim(redis_keys.FRONTIER_WAKE, 0, 63)
            pipe.execute()
        return {0: None, 1: "running", 2: "completed"}[code]

    def is_running(self, job_id: str, cycle: int = 0) -> bool:
        """True while the job (in ``cycle``, for a scheduled job) is neither cancelled nor completed."""
        state, current = self._redis.hmget(redis_keys.job(job_id), ["state", "cycle"])
        return _text(state) == "running" and (not cycle or int(current or 0) == cycle)

    def running_jobs(self) -> list[str]:
        """Ids of the jobs the pumps should look at."""
        return sorted(_text(job) for job in self._redis.smembers(redis_keys.JOBS_RUNNING))

    def forget_if_stopped(self, job_id: str, filter_keys: Sequence[str] = ()) -> None:
        """Drop a job from the running set once its state says it is not running; once it has
        finished, drop its Bloom filter (``filter_keys``) too."""
        if _text(self._redis.hget(redis_keys.job(job_id), "state")) != "running":
            self._redis.srem(redis_keys.JOBS_RUNNING, job_id)
            if filter_keys:
                self._drop_filter(keys=[redis_keys.job(job_id), *filter_keys])

    def raw_state(self, job_id: str) -> dict[str, str]:
        """The job hash as strings (spec, state, timestamps, counters)."""
        return {_text(k): _text(v) for k, v in self._redis.hgetall(redis_keys.job(job_id)).items()}

    def hosts_seen(self, job_id: str) -> int:
        """Hosts the job has sent at least one request to."""
        return int(self._redis.hlen(redis_keys.job_next(job_id)))

    def in_flight(self, job_id: str) -> int:
        """Batches leased and not yet released."""
        return int(self._redis.hlen(redis_keys.job_leases(job_id)))

    def wait_for_work(self, timeout_s: float) -> None:
        """Block until URLs are admitted somewhere or ``timeout_s`` passes."""
        self._redis.blpop([redis_keys.FRONTIER_WAKE], timeout=max(0.01, timeout_s))


def _job_keys(job_id: str, *names: str) -> tuple[str, ...]:
    makers = {
        "meta": redis_keys.job,
        "ready": redis_keys.job_ready,
        "next": redis_keys.job_next,
        "busy": redis_keys.job_busy,
        "leases": redis_keys.job_leases,
        "delays": redis_keys.job_delays,
    }
    return tuple(makers[name](job_id) for name in names)


def stats_minute(now_s: float) -> int:
    """The per-minute statistics bucket of a moment (minutes since the epoch)."""
    return int(now_s // 60)


def _history_args(history: Mapping[str, UrlHistory] | None) -> list[str | float]:
    args: list[str | float] = []
    for url, record in (history or {}).items():
        args.extend((url, record.encode(), record.due_s()))
    return args


def _counter_args(counters: Mapping[str, int] | None) -> list[str | int]:
    args: list[str | int] = []
    for name, value in (counters or {}).items():
        if value:
            args.extend((name, value))
    return args


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
