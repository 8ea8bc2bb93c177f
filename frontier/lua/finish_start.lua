-- Mark the start of a scheduled job's cycle done: its seeds and due URLs are all admitted.
--
-- KEYS: meta, todo
-- ARGV: 1 cycle
-- Returns 1.
if redis.call('HGET', KEYS[1], {{META_CYCLE}}) == ARGV[1] then
  redis.call('HDEL', KEYS[1], {{META_STARTING}})
  redis.call('DEL', KEYS[2])
end
return 1
