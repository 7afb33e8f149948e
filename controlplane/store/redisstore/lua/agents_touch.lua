-- agents_touch.lua: Redis.TouchAgent. KEYS: one agents hash per account.
-- ARGV: agent id, stream nonce, until (ms since the epoch), now (ms).
-- Each hash maps an agent id to "until stream"; its time to live covers
-- the latest until it holds.
local value = ARGV[3] .. ' ' .. ARGV[2]
local ttl = tonumber(ARGV[3]) - tonumber(ARGV[4])
if ttl < 1 then ttl = 1 end
for _, k in ipairs(KEYS) do
  redis.call('HSET', k, ARGV[1], value)
  if redis.call('PTTL', k) < ttl then redis.call('PEXPIRE', k, ttl) end
end
return #KEYS
