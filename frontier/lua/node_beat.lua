-- A ring node's heartbeat: (re)register it and stamp the time, on the Redis clock.
--
-- KEYS: nodes, beats, down
-- ARGV: 1 name   2 registration (JSON)   3 leaving ('1': the node stops; its beat is set to 0, so
--       any watcher hands its hosts and batches over at once)
-- Returns the time of the beat (ms).
local now = clock_ms()
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
else
  redis.call('ZADD', KEYS[2], now, ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
return now
