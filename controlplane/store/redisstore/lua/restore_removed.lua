-- restore_removed: put one removal back, deleting the record it removed
-- unless the store holds a newer one.
-- KEYS[1] the removals hash; for a login KEYS[2] its hash and KEYS[3] the
-- index set, for a credential (or member) KEYS[2] the records hash and
-- KEYS[3] their versions. ARGV[1] "login", "cred" or "member", ARGV[2] the
-- key or name, ARGV[3] the removed version. Returns 1 when it deleted a
-- record.
local v = tonumber(ARGV[3])
local field = ARGV[1] .. ":" .. ARGV[2]
local tomb = tonumber(redis.call("HGET", KEYS[1], field) or "0") or 0
if tomb < v then
  redis.call("HSET", KEYS[1], field, v)
end
if ARGV[1] == "login" then
  local cur = tonumber(redis.call("HGET", KEYS[2], "gen") or "0") or 0
  if redis.call("EXISTS", KEYS[2]) == 1 and cur <= v then
    redis.call("DEL", KEYS[2])
    redis.call("SREM", KEYS[3], ARGV[2])
    return 1
  end
else
  local cur = tonumber(redis.call("HGET", KEYS[3], ARGV[2]) or "0") or 0
  if redis.call("HEXISTS", KEYS[2], ARGV[2]) == 1 and cur <= v then
    redis.call("HDEL", KEYS[2], ARGV[2])
    redis.call("HDEL", KEYS[3], ARGV[2])
    return 1
  end
end
return 0
