-- login_remove: delete one login and record its removal.
-- KEYS[1] the login hash, KEYS[2] the index set, KEYS[3] the removals
-- hash, KEYS[4] the epoch. ARGV[1] the account key, ARGV[2] the epoch the
-- writer serves under. Returns the removed generation, 0 when there was
-- no login, -3 when the store's epoch is not the writer's.
if ARGV[2] ~= "" and redis.call("GET", KEYS[4]) ~= ARGV[2] then
  return -3
end
redis.call("SREM", KEYS[2], ARGV[1])
if redis.call("EXISTS", KEYS[1]) == 0 then
  return 0
end
local gen = tonumber(redis.call("HGET", KEYS[1], "gen") or "0") or 0
local tomb = tonumber(redis.call("HGET", KEYS[3], "login:" .. ARGV[1]) or "0") or 0
gen = math.max(gen, tomb, 1)
redis.call("DEL", KEYS[1])
redis.call("HSET", KEYS[3], "login:" .. ARGV[1], gen)
return gen
