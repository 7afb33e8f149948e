-- lease_release: drop a lease if it is still held with this fencing token.
-- KEYS[1] the lease, ARGV[1] the token.
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
