-- agents_count.lua: Redis.LiveAgents. KEYS: one agents hash per account.
-- ARGV: now (ms since the epoch). Returns, per key, the agents whose
-- until is after now, and forgets the others.
local out = {}
local now = tonumber(ARGV[1])
for i, k in ipairs(KEYS) do
  local all = redis.call('HGETALL', k)
  local n = 0
  for j = 1, #all, 2 do
    local expiry = tonumber(string.match(all[j + 1], '^(%d+) '))
    if expiry and expiry > now then
      n = n + 1
    else
      redis.call('HDEL', k, all[j])
    end
  end
  out[i] = n
end
return out
