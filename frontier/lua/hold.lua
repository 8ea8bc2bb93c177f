-- Hold a job's host: it asked for no request for a while (a 429/503 with Retry-After, an API's spent
-- rate limit). No batch of the host is leased or started until the hold ends, and every worker
-- process is told at once (PUBLISH), so the host's batches already fetching make no further request
-- to it (frontier.holds, engine.fetch_batch).
--
-- KEYS: ready, next, holds
-- ARGV: 1 host   2 hold_ms   3 channel   4 message (what the worker processes are told: JSON)
-- Returns the hold's end (ms, Redis time).
--
-- A hold only ever lengthens what is there: the host's hold, its next time (admit.lua makes a host
-- ready from it) and its score in ready, if it is there (release.lua puts a host back no earlier
-- than its hold).
local host, till = ARGV[1], clock_ms() + tonumber(ARGV[2])
if till > tonumber(redis.call('HGET', KEYS[3], host) or '0') then redis.call('HSET', KEYS[3], host, till) end
if till > tonumber(redis.call('HGET', KEYS[2], host) or '0') then redis.call('HSET', KEYS[2], host, till) end
redis.call('ZADD', KEYS[1], 'XX', 'GT', till, host)
redis.call('PUBLISH', ARGV[3], ARGV[4])
return till
