-- login_put: write one login over an expected generation, under a lease.
-- KEYS[1] the login hash (gen, data), KEYS[2] the lease, KEYS[3] the index set.
-- ARGV[1] the expected generation (0: no record), ARGV[2] the lease's
-- fencing token ("" for none), ARGV[3] the record (JSON), ARGV[4] the
-- account key. Returns the new generation, -1 on a generation conflict,
-- -2 when the lease is no longer held with that token.
if ARGV[2] ~= "" and redis.call("GET", KEYS[2]) ~= ARGV[2] then
  return -2
end
local gen = tonumber(redis.call("HGET", KEYS[1], "gen") or "0")
if gen ~= tonumber(ARGV[1]) then
  return -1
end
redis.call("HSET", KEYS[1], "gen", gen + 1, "data", ARGV[3])
redis.call("SADD", KEYS[3], ARGV[4])
return gen + 1
