-- Move a task's status trail to a new state, unless that would go back: a late or redelivered
-- message cannot undo a later state, except a retry, which moves back one step from the state it
-- interrupts.
-- KEYS: the trail hash
-- ARGV: new state, ttl_s, now (epoch s), counter to increment ('' for none), the state a retry
--       interrupts ('' for none), then field, value pairs to set when the move applies
-- Returns {1 if applied else 0, the counter's new value (0 without a counter)}
local ranks = {[{{TASK_QUEUED}}] = 0, [{{TASK_DOWNLOADING}}] = 1, [{{TASK_DOWNLOADED}}] = 2,
               [{{TASK_DOWNLOAD_FAILED}}] = 3, [{{TASK_ROBOTS_BLOCKED}}] = 3, [{{TASK_ANALYZING}}] = 3,
               [{{TASK_ANALYZED}}] = 4, [{{TASK_ANALYSIS_FAILED}}] = 4}
local key, new, ttl, now = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local counter, retry_from = ARGV[4], ARGV[5]
local count = 0
if counter ~= '' then count = redis.call('HINCRBY', key, counter, 1) end
local current = redis.call('HGET', key, 'state')
local applied = 1
if current and ranks[current] then
  if retry_from ~= '' then
    if current ~= retry_from then applied = 0 end
  elseif ranks[new] < ranks[current] then
    applied = 0
  end
end
if applied == 1 then
  redis.call('HSET', key, 'state', new, new .. '_at', now)
  for i = 6, #ARGV, 2 do redis.call('HSET', key, ARGV[i], ARGV[i + 1]) end
end
redis.call('EXPIRE', key, ttl)
return {applied, count}
