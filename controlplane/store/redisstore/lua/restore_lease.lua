-- restore_lease: put back a refresh lease this replica held before the
-- store lost it. KEYS[1] the lease. ARGV[1] its fencing token, ARGV[2]
-- its remaining lifetime (ms). Returns 1 when the lease is this one's
-- (put back, or still there), 0 when another holder has it.
local cur = redis.call("GET", KEYS[1])
if cur == ARGV[1] then
  return 1
end
if cur then
  return 0
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return 1
