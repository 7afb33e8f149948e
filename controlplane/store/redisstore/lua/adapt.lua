-- adapt.lua: Memory.Adapt for one account. KEYS: account, policies,
-- adaptive set (an account with the default policy leaves it once
-- recovered or expired).
-- ARGV: account key, now (us), default record, idle ms, the notification
-- channel, this replica's id. Returns a snapshot when the effective rate rose (and publishes
-- it), else nil.
local now = tonumber(ARGV[2])
local s = load(KEYS[1])
local p, rec = policy(KEYS[2], ARGV[1], ARGV[3])
if not s then
  if not p.custom then redis.call('SREM', KEYS[3], ARGV[1]) end
  return false
end
local raised = aAdvance(s.a, p.rate, now)
if not p.custom and (not s.a.on or s.a.eff >= p.rate) and not aPaused(s.a, now) then
  redis.call('SREM', KEYS[3], ARGV[1])
end
if not raised then return false end
sync(s, p, now)
save(KEYS[1], s, p.rate, now, tonumber(ARGV[4]))
redis.call('PUBLISH', ARGV[5], ARGV[1] .. ' ' .. itoa(p.version) .. ' ' .. ARGV[6])
return snapshot(s, p, rec, now)
