-- Start the next cycle of a scheduled job (creating the job on its first firing).
--
-- KEYS: meta, ready, next, busy, leases, admit_tokens, history, due, todo, cycles, delays,
--       then what is deleted with the cycle: queued_urls, inlinks, the job's Bloom filter segments
-- ARGV (built by frontier.lifecycle._new_cycle_argv):
--   1 firing   2 spec_json   3 overlap ('skip' | 'cancel')   4 qprefix (the key prefix of the
--   job's per-host queues)   5 cycles_kept   6 strategy (the spec's: meta's strategy field)
-- Returns {status ('started', 'resumed', 'skipped' or 'one-off'), cycle, URLs due}
--
-- Archives the last cycle's counters, clears what was per cycle (queues, leases, Bloom filter,
-- tokens), keeps what carries over (history, due times, hosts' next times and Crawl-delays), and
-- copies the URLs due now into `todo`. `pending` starts at 1, held by the starter until all
-- seeds and due URLs are admitted.
local meta, ready, nextk, busy, leases, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local hist, due, todo, cycles = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local firing, spec, overlap, qprefix, kept = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local strategy = ARGV[6]
local now = clock_ms()
local cycle = tonumber(redis.call('HGET', meta, {{META_CYCLE}}) or '0')
local state = redis.call('HGET', meta, {{META_STATE}})
-- The same firing again (redelivered), or any firing while a start never finished: finish it.
local active = state == {{STATE_RUNNING}} or state == {{STATE_PAUSED}}
if redis.call('HGET', meta, {{META_FIRING}}) == firing or (active and redis.call('HGET', meta, {{META_STARTING}})) then
  return {'resumed', cycle, redis.call('ZCARD', todo)}
end
if state and cycle == 0 then
  return {'one-off', 0, 0}
end
if active then
  if overlap == 'skip' then
    redis.call('HINCRBY', meta, {{META_SKIPPED_FIRINGS}}, 1)
    redis.call('HSET', meta, {{META_LAST_SKIPPED_AT}}, now / 1000)
    return {'skipped', cycle, 0}
  end
  state = {{STATE_CANCELLED}}
  redis.call('HSET', meta, {{META_FINISHED_AT}}, now / 1000)
end
-- What carries over from cycle to cycle; every other field is the last cycle's, archived.
local carried = {[{{META_SPEC}}] = 1, [{{META_SEQ}}] = 1, [{{META_BATCH_SEQ}}] = 1, [{{META_CYCLE}}] = 1,
                 [{{META_CREATED_AT}}] = 1, [{{META_SKIPPED_FIRINGS}}] = 1, [{{META_LAST_SKIPPED_AT}}] = 1,
                 [{{META_FIRING}}] = 1, [{{META_SPEC_REV}}] = 1, [{{META_STRATEGY}}] = 1}
local all = redis.call('HGETALL', meta)
local summary = {cycle = cycle, state = state, counters = {}}
local drop = {}
for j = 1, #all, 2 do
  local name, value = all[j], all[j + 1]
  if not carried[name] then
    drop[#drop + 1] = name
    if name == {{META_STARTED_AT}} or name == {{META_FINISHED_AT}} then
      summary[name] = tonumber(value)
    elseif name ~= {{META_STATE}} then
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
for j = 12, #KEYS do redis.call('UNLINK', KEYS[j]) end  -- large: memory freed in the background
redis.call('HSET', meta, {{META_SPEC}}, spec, {{META_STATE}}, {{STATE_RUNNING}}, {{META_CYCLE}}, cycle + 1,
           {{META_STARTED_AT}}, now / 1000, {{META_FIRING}}, firing, {{META_PENDING}}, 1, {{META_ADMITTED}}, 0,
           {{META_QUEUED_NOW}}, 0, {{META_STARTING}}, 1, {{META_STRATEGY}}, strategy)
redis.call('HSETNX', meta, {{META_CREATED_AT}}, now / 1000)
local taken = redis.call('ZRANGESTORE', todo, due, '-inf', now / 1000, 'BYSCORE')
return {'started', cycle + 1, taken}
