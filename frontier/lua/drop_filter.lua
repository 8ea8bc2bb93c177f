-- Delete a finished job's Bloom filter (megabytes each), and a priority job's URL index.
--
-- KEYS: meta, then the job's Bloom filter segments, queued_urls, inlinks
-- ARGV: none
-- Returns 1 if the filter was deleted, 0 if the job is not finished.
--
-- A paused or restarted job keeps its filter; checked here, in one step with the delete, so a
-- new cycle's filter is safe.
local state = redis.call('HGET', KEYS[1], {{META_STATE}})
if state ~= {{STATE_COMPLETED}} and state ~= {{STATE_CANCELLED}} and state ~= {{STATE_FAILED}} then return 0 end
-- UNLINK: gone from the keyspace at once, their memory freed in the background (no stall).
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
return 1
