-- login_put: write one login over an expected generation, under a lease.
-- KEYS[1] the login hash (gen, data), KEYS[2] the lease, KEYS[3] the index
-- set, KEYS[4] the removals hash, KEYS[5] the epoch.
-- ARGV[1] the expected generation (0: no record; -1: replace whatever is
-- stored, an unreadable record included), ARGV[2] the lease's fencing
-- token ("" for none), ARGV[3] the record (JSON), ARGV[4] the account
-- key, ARGV[5] the epoch the writer serves under ("": none yet).
-- Returns the new generation, -1 on a generation conflict, -2 when the
-- lease is no longer held with that token, -3 when the store's epoch is
-- not the writer's (the store lost its data: heal first). A generation
-- only grows, past the last removal's too, so a restore can tell the
-- newer of two copies.
if ARGV[5] ~= "" and redis.call("GET", KEYS[5]) ~= ARGV[5] then
  return -3
end
if ARGV[2] ~= "" and redis.call("GET", KEYS[2]) ~= ARGV[2] then
  return -2
end
local gen = tonumber(redis.call("HGET", KEYS[1], "gen") or "0")
if ARGV[1] ~= "-1" and gen ~= tonumber(ARGV[1]) then
  return -1
end
local tomb = tonumber(redis.call("HGET", KEYS[4], "login:" .. ARGV[4]) or "0") or 0
local next = math.max(gen or 0, tomb) + 1
redis.call("HSET", KEYS[1], "gen", next, "data", ARGV[3])
redis.call("SADD", KEYS[3], ARGV[4])
return next
