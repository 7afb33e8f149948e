-- restore_policy: put one policy record back unless the store holds it in
-- the same or a newer version.
-- KEYS[1] the policies hash, KEYS[2] the store-wide version, KEYS[3] the
-- adaptive set. ARGV[1] the account key, ARGV[2] the record ("version
-- rate burst idle_ms total_ms retries bound_ms adaptive"). Returns 1
-- when it wrote the record, else 0. An unreadable stored record is
-- replaced. The caller publishes one notification for a whole restore.
local v = tonumber(string.match(ARGV[2], "^(%d+) "))
local cur = redis.call("HGET", KEYS[1], ARGV[1])
if cur then
  local cv = tonumber(string.match(cur, "^(%-?%d+) "))
  if cv and cv >= v then
    return 0
  end
end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
local sv = tonumber(redis.call("GET", KEYS[2]) or "0")
if not sv or sv < v then
  redis.call("SET", KEYS[2], v)
end
if string.sub(ARGV[2], -1) == "1" then
  redis.call("SADD", KEYS[3], ARGV[1])
else
  redis.call("SREM", KEYS[3], ARGV[1])
end
return 1
