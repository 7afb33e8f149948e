-- agents_drop.lua: Redis.DropAgent. KEYS: one agents hash per account.
-- ARGV: agent id, stream nonce. Removes the agent only when the hash
-- holds that stream: a newer stream of the agent (on another replica)
-- stays.
local n = 0
for _, k in ipairs(KEYS) do
  local v = redis.call('HGET', k, ARGV[1])
  if v and string.match(v, '^%d+ (.*)$') == ARGV[2] then
    redis.call('HDEL', k, ARGV[1])
    n = n + 1
  end
end
return n
