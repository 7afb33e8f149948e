-- handover.lua: Memory.HandOver. KEYS: account, policies, the report's
-- idempotency key. ARGV: account key, now (us), default record, idle ms,
-- grants, idempotency ms. Debits the grants as if each had been admitted
-- here now, stopping at the first request the bucket would not debit.
-- Returns {-1} for a report already applied, else the tokens debited and
-- a snapshot.
local now = tonumber(ARGV[2])
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[6]) then return {-1} end
local p, rec = policy(KEYS[2], ARGV[1], ARGV[3])
local s = load(KEYS[1])
if s then
  prune(KEYS[1], s, now)
  aAdvance(s.a, p.rate, now)
  sync(s, p, now)
else
  s = create(p, now)
end
local n = 0
for _ = 1, tonumber(ARGV[5]) do
  if take(s.b, now)[5] ~= 1 then break end
  n = n + 1
end
save(KEYS[1], s, p.rate, now, tonumber(ARGV[4]))
local r = snapshot(s, p, rec, now)
table.insert(r, 1, n)
return r
