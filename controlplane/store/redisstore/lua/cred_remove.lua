-- cred_remove: delete one scoped agent credential (or member) and record
-- its removal. KEYS[1] the records hash, KEYS[2] their versions, KEYS[3]
-- the removals hash, KEYS[4] the epoch. ARGV[1] the name, ARGV[2] the
-- epoch the writer serves under, ARGV[3] the kind of the removals' field
-- ("cred", the default, or "member"). Returns the removed version, 0 when
-- there was none, -3 when the store's epoch is not the writer's.
if ARGV[2] ~= "" and redis.call("GET", KEYS[4]) ~= ARGV[2] then
  return -3
end
if redis.call("HEXISTS", KEYS[1], ARGV[1]) == 0 then
  return 0
end
local v = tonumber(redis.call("HGET", KEYS[2], ARGV[1]) or "0") or 0
local tomb = tonumber(redis.call("HGET", KEYS[3], (ARGV[3] or "cred") .. ":" .. ARGV[1]) or "0") or 0
v = math.max(v, tomb, 1)
redis.call("HDEL", KEYS[1], ARGV[1])
redis.call("HDEL", KEYS[2], ARGV[1])
redis.call("HSET", KEYS[3], (ARGV[3] or "cred") .. ":" .. ARGV[1], v)
return v
