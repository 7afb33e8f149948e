-- lease_acquire: take one account's refresh lease.
-- KEYS[1] the fencing counter, KEYS[2] the lease, KEYS[3] the healing
-- mark, KEYS[4] the epoch. ARGV[1] the lease's lifetime (ms), ARGV[2] the
-- epoch the taker serves under, ARGV[3] the highest fencing token the
-- taker knows for the account. Returns the fencing token of the lease
-- taken; 0 while another holder has it; -3 when the store's epoch is not
-- the taker's (the store lost its data: heal first); -4 while replicas
-- write their state back after a loss (no lease is handed out then, so a
-- holder from before the loss can put its own back first).
if redis.call("EXISTS", KEYS[3]) == 1 then
  return -4
end
if ARGV[2] ~= "" and redis.call("GET", KEYS[4]) ~= ARGV[2] then
  return -3
end
-- a lease without a lifetime is no holder's
if redis.call("PTTL", KEYS[2]) == -1 then
  redis.call("DEL", KEYS[2])
end
local ok, f = pcall(redis.call, "INCR", KEYS[1])
if not ok then
  -- an unreadable counter: start past every token the taker knows
  f = tonumber(ARGV[3]) + 1
  redis.call("SET", KEYS[1], f)
end
if f <= tonumber(ARGV[3]) then
  f = tonumber(ARGV[3]) + 1
  redis.call("SET", KEYS[1], f)
end
if redis.call("SET", KEYS[2], f, "NX", "PX", ARGV[1]) then
  return f
end
return 0
