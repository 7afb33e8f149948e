-- roster_remove: remove an agent from the fleet's roster, unless a newer
-- stream of the same agent wrote it since.
-- KEYS[1] roster hash; ARGV[1] agent id; ARGV[2] the ending stream.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and string.sub(v, 1, #ARGV[2] + 1) == ARGV[2] .. '\n' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
