-- KEYS: health hash   ARGV: proxy, base_ms, cap_ms
-- Returns {cool-off ms left, strikes, 1 if marked now / 0 if it was cooling off already}.
-- Redis's clock (TIME), so workers whose clocks differ agree on when a cool-off ends.
local key, proxy, base, cap = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms, strikes = 0, -1
local raw = redis.call('HGET', key, proxy)
if raw then
  local sep = string.find(raw, ':', 1, true)
  until_ms, strikes = tonumber(string.sub(raw, 1, sep - 1)), tonumber(string.sub(raw, sep + 1))
end
if until_ms > now then
  return {until_ms - now, strikes, 0}
end
if now - until_ms > cap then strikes = -1 end
strikes = math.min(strikes + 1, 30)
local cool = math.floor(math.min(cap, base * 2 ^ strikes))
redis.call('HSET', key, proxy, string.format('%d:%d', now + cool, strikes))
redis.call('PEXPIRE', key, 2 * cap + 1000)
return {cool, strikes, 1}
