-- restore_cred: put one scoped agent credential (or member) back unless
-- the store holds it in the same or a newer version, or removed it since.
-- KEYS[1] the records hash, KEYS[2] their versions, KEYS[3] the removals
-- hash. ARGV[1] the name, ARGV[2] the version, ARGV[3] the record (JSON),
-- ARGV[4] "1" to repair: write over the same version (its record was
-- found unreadable), ARGV[5] the kind of the removals' field ("cred", the
-- default, or "member"). Returns 1 when it wrote the record, else 0.
local v = tonumber(ARGV[2])
local tomb = tonumber(redis.call("HGET", KEYS[3], (ARGV[5] or "cred") .. ":" .. ARGV[1]) or "0") or 0
if tomb >= v then
  return 0
end
local cur = tonumber(redis.call("HGET", KEYS[2], ARGV[1]) or "")
if cur and (cur > v or (cur == v and ARGV[4] ~= "1")) and redis.call("HEXISTS", KEYS[1], ARGV[1]) == 1 then
  return 0
end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[3])
redis.call("HSET", KEYS[2], ARGV[1], v)
return 1
