-- report403.lua: Memory.Report403. KEYS: account, policies, adaptive set.
-- ARGV: account key, now (us), default record, idle ms, the notification
-- channel, this replica's id, the 403's retry-after (us, 0: none).
-- Returns nil for an unknown account, else a snapshot and whether the
-- effective rate or the pause changed (published when it did; the account
-- joins the adaptive set so that Adapt raises it again).
local now = tonumber(ARGV[2])
local p, rec = policy(KEYS[2], ARGV[1], ARGV[3])
local s = load(KEYS[1])
if not s then
  if not p.custom then return false end
  s = create(p, now)
end
local changed = aAdvance(s.a, p.rate, now)
if changed then sync(s, p, now) end
if aOn403(s.a, p.rate, now, tonumber(ARGV[7])) then
  sync(s, p, now)
  changed = true
end
-- a 403 restarts the quiet interval even when it lowers nothing
save(KEYS[1], s, p.rate, now, tonumber(ARGV[4]))
if changed then redis.call('SADD', KEYS[3], ARGV[1]) end
if changed then redis.call('PUBLISH', ARGV[5], ARGV[1] .. ' ' .. itoa(p.version) .. ' ' .. ARGV[6]) end
local r = snapshot(s, p, rec, now)
r[8] = changed and 1 or 0
return r
