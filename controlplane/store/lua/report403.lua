-- report403.lua: Memory.Report403. KEYS: account, policies. ARGV: account
-- key, now (us), default record, idle ms, the notification channel, this replica's id.
-- Returns nil for an unknown account, else a snapshot and whether the
-- effective rate changed (published when it did).
local now = tonumber(ARGV[2])
local p, rec = policy(KEYS[2], ARGV[1], ARGV[3])
local s = load(KEYS[1])
if not s then
  if not p.custom then return false end
  s = create(p, now)
end
local changed = aAdvance(s.a, p.rate, now)
if changed then sync(s, p, now) end
if aOn403(s.a, p.rate, now) then
  sync(s, p, now)
  changed = true
end
-- a 403 restarts the quiet interval even when it lowers nothing
save(KEYS[1], s, p.rate, now, tonumber(ARGV[4]))
if changed then redis.call('PUBLISH', ARGV[5], ARGV[1] .. ' ' .. itoa(p.version) .. ' ' .. ARGV[6]) end
local r = snapshot(s, p, rec, now)
r[7] = changed and 1 or 0
return r
