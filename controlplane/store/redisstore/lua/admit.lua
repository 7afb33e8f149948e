-- admit.lua: Memory.Admit. KEYS: account, policies. ARGV: account key,
-- now (us), default record, idle ms. Returns kind, wait ms, retry-after s,
-- required wait ms, debited, relaxed, reservation id of the debit, policy
-- version, pending reservation (0: nothing to cancel).
local now = tonumber(ARGV[2])
local p = policy(KEYS[2], ARGV[1], ARGV[3])
local s = load(KEYS[1])
if s then
  prune(KEYS[1], s, now)
  aAdvance(s.a, p.rate, now)
  sync(s, p, now)
else
  s = create(p, now)
end
local d
local pu = aPaused(s.a, now)
if pu then
  -- store.pauseDecision: refuse until the pause's end unless it ends
  -- within the bound (or the policy cannot refuse); then wait for it.
  local rem = pu - now
  local remMs = idiv(rem + 999, 1000)
  if rem > s.b.bound * 1000 and s.b.canRefuse then
    d = {3, 0, idiv(rem + 999999, 1000000), remMs, 0, 0, 0}
  else
    d = take(s.b, now)
    local w = math.min(remMs, s.b.bound)
    if d[1] ~= 3 and w > d[2] then
      d[1], d[2], d[4] = 2, w, math.max(d[4], w)
    end
  end
else
  d = take(s.b, now)
end
local pending = 0
if d[5] == 1 and d[2] > 0 then
  addPending(KEYS[1], s, d[7], now + d[2] * 1000)
  pending = d[7]
end
save(KEYS[1], s, p.rate, now, tonumber(ARGV[4]))
d[8] = p.version
d[9] = pending
return d
