-- End a single task's request to a host (frontier.politeness.HostGate).
--
-- KEYS: 1 next   2 free   3 busy
-- ARGV: 1 now_ms   2 pause_ms   3 busy_ms
-- Returns 1.
local now, pause, busy_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('DEL', KEYS[3])
redis.call('SET', KEYS[2], now + pause, 'PX', pause + busy_ms)
return 1
