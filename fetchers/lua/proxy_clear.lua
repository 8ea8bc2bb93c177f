-- KEYS: health hash   ARGV: proxy.  Forget a proxy's record once its cool-off is over (it works again).
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(string.sub(raw, 1, string.find(raw, ':', 1, true) - 1)) > now then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
