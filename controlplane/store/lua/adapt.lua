-- adapt.lua: Memory.Adapt for one account. KEYS: account, policies.
-- ARGV: account key, now (us), default record, idle ms, the notification
-- channel, this replica's id. Returns a snapshot when the effective rate rose (and publishes
-- it), else nil.
local now = tonumber(ARGV[2])
local s = load(KEYS[1])
if not s then return false end
local p, rec = policy(KEYS[2], ARGV[1], ARGV[3])
if not aAdvance(s.a, p.rate, now) then return false end
sync(s, p, now)
save(KEYS[1], s, p.rate, now, tonumber(ARGV[4]))
redis.call('PUBLISH', ARGV[5], ARGV[1] .. ' ' .. itoa(p.version) .. ' ' .. ARGV[6])
return snapshot(s, p, rec, now)
