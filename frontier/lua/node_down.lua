-- Claim a silent ring node's death: exactly one watcher wins and hands its work over.
--
-- KEYS: beats, down, claim (redis_keys.node_handover of the name and last beat)
-- ARGV: 1 name   2 last beat seen (ms)   3 timeout_ms   4 claim TTL (s)
-- Returns 1 (claimed: the caller hands over), 0 (it beat again, or another watcher claimed it).
local now = clock_ms()
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not beat or tonumber(beat) ~= tonumber(ARGV[2]) then return 0 end
if tonumber(beat) >= now - tonumber(ARGV[3]) then return 0 end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
if not redis.call('SET', KEYS[3], now, 'NX', 'EX', tonumber(ARGV[4])) then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({at = now, beat = tonumber(beat)}))
return 1
