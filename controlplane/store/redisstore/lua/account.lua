-- account.lua: Memory.Account. KEYS: account, policies. ARGV: account
-- key, now (us), default record, idle ms. Returns a snapshot, or nil for
-- an account with neither state nor a stored policy.
local now = tonumber(ARGV[2])
local p, rec = policy(KEYS[2], ARGV[1], ARGV[3])
local s = load(KEYS[1])
if not s then
  if not p.custom then return false end
  return snapshot(create(p, now), p, rec, now)
end
local changed = aAdvance(s.a, p.rate, now)
if sync(s, p, now) or changed then save(KEYS[1], s, p.rate, now, tonumber(ARGV[4])) end
return snapshot(s, p, rec, now)
