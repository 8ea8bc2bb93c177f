-- Test (and add) URLs in one segment of a Bloom filter (frontier.dedup.BloomFilter).
--
-- KEYS: 1 the segment
-- ARGV: 1 k (bits per URL)   2 '1' to add, '0' to only test   then k bit offsets per URL
-- Returns, per URL in order, 1 if it was (probably) there before, else 0.
--
-- URLs are handled in order, so a URL repeated in one batch is new only the first time.
-- BITFIELD_RO reads first: a URL already present costs no write (and nothing is replicated or
-- appended to the AOF for it).
local key = KEYS[1]
local k = tonumber(ARGV[1])
local add = ARGV[2] == '1'
local get, set, out = {}, {}, {}
for j = 1, k do
  get[3 * j - 2] = 'GET'; get[3 * j - 1] = 'u1'
  set[4 * j - 3] = 'SET'; set[4 * j - 2] = 'u1'; set[4 * j] = 1
end
local p = 3
for u = 1, (#ARGV - 2) / k do
  for j = 1, k do get[3 * j] = ARGV[p + j - 1] end
  local bits = redis.call('BITFIELD_RO', key, unpack(get))
  local seen = 1
  for j = 1, k do
    if bits[j] == 0 then seen = 0; break end
  end
  if seen == 0 and add then
    for j = 1, k do set[4 * j - 1] = ARGV[p + j - 1] end
    redis.call('BITFIELD', key, unpack(set))
  end
  out[u] = seen
  p = p + k
end
return out
