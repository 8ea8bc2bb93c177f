-- A job split over a Redis Cluster (frontier.partitions) completed: each of its partitions, and
-- its own hash last, is marked so once every partition was idle at one moment.
--
-- KEYS: meta (a partition's, or the job's)
-- ARGV: 1 now (s)
-- Returns 1 if this marked it, 0 if it was no longer running.
if redis.call('HGET', KEYS[1], {{META_STATE}}) ~= {{STATE_RUNNING}} then return 0 end
redis.call('HSET', KEYS[1], {{META_STATE}}, {{STATE_COMPLETED}}, {{META_FINISHED_AT}}, ARGV[1])
return 1
