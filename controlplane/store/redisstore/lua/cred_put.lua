-- cred_put: create or replace one scoped agent credential (or member).
-- KEYS[1] the records hash (name -> JSON), KEYS[2] their versions
-- (name -> version), KEYS[3] the removals hash, KEYS[4] the epoch.
-- ARGV[1] the name, ARGV[2] the record (JSON), ARGV[3] the epoch the
-- writer serves under, ARGV[4] the kind of the removals' field ("cred",
-- the default, or "member"). Returns the new version, or -3 when the
-- store's epoch is not the writer's.
if ARGV[3] ~= "" and redis.call("GET", KEYS[4]) ~= ARGV[3] then
  return -3
end
local v = tonumber(redis.call("HGET", KEYS[2], ARGV[1]) or "0") or 0
local tomb = tonumber(redis.call("HGET", KEYS[3], (ARGV[4] or "cred") .. ":" .. ARGV[1]) or "0") or 0
v = math.max(v, tomb) + 1
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
redis.call("HSET", KEYS[2], ARGV[1], v)
return v
