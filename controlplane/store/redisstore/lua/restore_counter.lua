-- restore_counter: raise a counter (the store-wide version, a fencing
-- counter) to at least ARGV[1]; an unreadable one is replaced.
-- KEYS[1] the counter. Returns 1 when it changed it.
local cur = tonumber(redis.call("GET", KEYS[1]) or "0")
if cur and cur >= tonumber(ARGV[1]) then
  return 0
end
redis.call("SET", KEYS[1], ARGV[1])
return 1
