-- Reserve a request slot at a host for a single task (frontier.politeness.HostGate).
--
-- KEYS: 1 next (the reservation chain)   2 free (a pause after the last request ended)   3 busy
-- ARGV: 1 now_ms   2 pause_ms   3 reserved_ms (a slot a previous call returned, or -1)   4 busy_ms
-- Returns 0 to start now, else the time (ms) to come back at, holding or taking a reservation.
local now, pause = tonumber(ARGV[1]), tonumber(ARGV[2])
local reserved, busy_ms = tonumber(ARGV[3]), tonumber(ARGV[4])
local nxt = tonumber(redis.call('GET', KEYS[1]) or '0')
local free = tonumber(redis.call('GET', KEYS[2]) or '0')
local busy = redis.call('EXISTS', KEYS[3]) == 1
if reserved >= 0 and reserved <= now then
  -- our slot has come: start if the host is idle and rested, else keep our place in line
  if busy then return now + pause end
  if now < free then return free end
  redis.call('SET', KEYS[3], '1', 'PX', busy_ms)
  return 0
end
if not busy and now >= free and nxt <= now then
  redis.call('SET', KEYS[3], '1', 'PX', busy_ms)
  redis.call('SET', KEYS[1], now + pause, 'PX', pause + busy_ms)
  return 0
end
local slot = math.max(nxt, free, now + 1)
redis.call('SET', KEYS[1], slot + pause, 'PX', slot + pause - now + busy_ms)
return slot
