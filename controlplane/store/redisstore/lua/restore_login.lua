-- restore_login: put one login back unless the store holds it in the same
-- or a newer generation, or removed it since.
-- KEYS[1] the login hash, KEYS[2] the index set, KEYS[3] the removals
-- hash. ARGV[1] the account key, ARGV[2] the generation, ARGV[3] the
-- record (JSON), ARGV[4] "1" to repair: write over the same generation
-- (its data was found unreadable). Returns 1 when it wrote the login,
-- else 0. A record with an unreadable generation is replaced.
local g = tonumber(ARGV[2])
local tomb = tonumber(redis.call("HGET", KEYS[3], "login:" .. ARGV[1]) or "0") or 0
if tomb >= g then
  return 0
end
local cur = tonumber(redis.call("HGET", KEYS[1], "gen") or "")
if cur and (cur > g or (cur == g and ARGV[4] ~= "1")) and redis.call("HEXISTS", KEYS[1], "data") == 1 then
  return 0
end
redis.call("HSET", KEYS[1], "gen", g, "data", ARGV[3])
redis.call("SADD", KEYS[2], ARGV[1])
return 1
