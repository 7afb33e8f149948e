-- admit.lua: Memory.Admit. It runs on every Admit, so unlike the other
-- scripts it is not prepended with prelude.lua: it is the prelude's
-- policy, load, prune, aAdvance, sync, create, aPaused, take, addPending
-- and save written out in line over plain locals, so a call builds one
-- closure and one table (the reply) instead of some thirty closures and
-- a table per record. A change to the bucket math in prelude.lua must be
-- made here too (the conformance suite runs both paths).
--
-- KEYS: account, policies. ARGV: account key, now (us), idle ms, and the
-- default policy as numbers: rate, burst, bound ms, retries, adaptive
-- (0/1) (its version is 0). Returns kind, wait ms, retry-after s,
-- required wait ms, debited, relaxed, reservation id of the debit, policy
-- version, pending reservation (0: nothing to cancel).
local TU = 60000000000
local RAISE_EVERY = 30000000
local FAR = 1e15
local floor, min, max = math.floor, math.min, math.max
local key = KEYS[1]
local now = tonumber(ARGV[2])

-- The policy: the account's record, or the default one.
local pver, prate, pburst, pbound, pretries, padapt
local rec = redis.call('HGET', KEYS[2], ARGV[1])
if rec then
  local v, r, b, _, _, y, w, a = string.match(rec,
    '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ([01])$')
  if not v then error('clodex: malformed policy record ' .. rec) end
  pver, prate, pburst, pbound, pretries, padapt = tonumber(v), tonumber(r), tonumber(b), tonumber(w), tonumber(y), a == '1'
else
  pver, prate, pburst, pbound, pretries, padapt = 0, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]),
    tonumber(ARGV[7]), ARGV[8] == '1'
end

-- The state (prelude.lua's load: field 'S', else the legacy text 's').
local u, t, q, pm, pn, rate, burst, bound, retries, ao, ae, al, aq, ap, ai
local legacy = false
local st = redis.call('HGET', key, 'S')
if st then
  if #st ~= 120 then error('clodex: malformed account state of ' .. #st .. ' bytes') end
  u, t, q, pm, pn, rate, burst, bound, retries, ao, ae, al, aq, ap, ai = struct.unpack('<ddddddddddddddd', st)
  if not (t == t and u == u and rate >= 0 and rate <= 600 and burst >= 1 and burst <= 1000
      and bound >= 0 and bound <= 15000 and retries >= 0 and retries <= 10) then
    error('clodex: malformed account state (values out of range)')
  end
  ao = ao == 1
else
  st = redis.call('HGET', key, 's')
  if st then
    local f = {string.match(st, '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ([01]) (%-?%d+) (%-?%d+) (%-?%d+) ?(%-?%d*) ?(%-?%d*)$')}
    if not f[1] then error('clodex: malformed account state ' .. st) end
    u, t, q, pm, pn, rate, burst, bound, retries = tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), tonumber(f[4]),
      tonumber(f[5]), tonumber(f[6]), tonumber(f[7]), tonumber(f[8]), tonumber(f[9])
    ao, ae, al, aq, ap, ai = f[10] == '1', tonumber(f[11]), tonumber(f[12]), tonumber(f[13]), tonumber(f[14]) or 0,
      tonumber(f[15]) or 0
    rate, burst = min(max(rate, 0), 600), min(max(burst, 1), 1000)
    bound, retries = min(max(bound, 0), 15000), min(max(retries, 0), 10)
    legacy = true
  end
end

-- The applied policy's derived values (prelude.lua's apply), and advance.
local enabled, hint, canRefuse, cap, lowest
local function derive()
  enabled = rate > 0 and bound > 0
  hint = max(floor(bound / 1000), 1)
  canRefuse = bound > 0 and retries * hint * 1000 * rate >= 60000
  cap = burst * TU
  lowest = -bound * 1000000 * rate
end
local function advance()
  if now <= t then return end
  local e = now - t
  if e > FAR / 1000 then e = FAR else e = e * 1000 end
  t = now
  if e > floor((cap - u) / rate) then u = cap else u = u + e * rate end
end

-- The configured rate at the adaptive effective rate (aRate), clamped.
local function effective()
  local r = prate
  if ao and prate ~= 0 then r = min(ae, prate) end
  return min(max(r, 0), 600)
end

if st then
  derive()
  -- prune: forget at most 64 reservations that departed by now.
  local n = 0
  while pn > 0 and pm <= q and n < 64 do
    local dep = redis.call('HGET', key, 'p' .. string.format('%d', pm))
    if dep then
      if tonumber(dep) > now then break end
      redis.call('HDEL', key, 'p' .. string.format('%d', pm))
      pn = pn - 1
    end
    pm = pm + 1
    n = n + 1
  end
  -- aAdvance
  if ao and prate ~= 0 and ae < prate then
    local step = max(1, floor(prate / 10))
    while ae < prate and now - aq >= RAISE_EVERY do
      ae = min(prate, ae + step)
      aq = aq + RAISE_EVERY
    end
    if ae >= prate then ai = 0 end
  end
  -- sync (setPolicy when the applied policy differs)
  local r = effective()
  local b, w, y = min(max(pburst, 1), 1000), min(max(pbound, 0), 15000), min(max(pretries, 0), 10)
  if rate ~= r or burst ~= b or bound ~= w or retries ~= y then
    local was = enabled
    if was then advance() end
    rate, burst, bound, retries = r, b, w, y
    derive()
    if not was then u = cap end
    u = min(u, cap)
    if now > t or not was then t = now end
  end
else
  -- create: a full bucket, adaptive mode started over.
  ao, ae, al, aq, ap, ai = padapt, prate, -1, now, 0, 0
  rate, burst = effective(), min(max(pburst, 1), 1000)
  bound, retries = min(max(pbound, 0), 15000), min(max(pretries, 0), 10)
  derive()
  u, t, q, pm, pn = cap, now, 0, 1, 0
end

-- The decision: take, under the adaptive pause (store.pauseDecision).
local kind, wait, ra, req, debited, relaxed, id = 1, 0, 0, 0, 0, 0, 0
local rem = -1
if ao and ap > now then rem = ap - now end
if rem > 0 and rem > bound * 1000 and canRefuse then
  kind, ra, req = 3, floor((rem + 999999) / 1000000), floor((rem + 999) / 1000)
else
  if enabled then
    advance()
    local dkind, dwait, dreq = 0, 0, 0
    if u >= TU then
      dkind = 1
    else
      local need = TU - u
      local cw = floor((floor((need + rate - 1) / rate) + 999999) / 1000000)
      if need <= -lowest then
        dkind, dwait, dreq = 2, cw, cw
      elseif canRefuse then
        kind, ra, req = 3, hint, cw
      elseif u > lowest then
        dkind, dwait, dreq = 2, bound, cw
      else
        relaxed = 1
      end
    end
    if dkind ~= 0 then
      u, q = u - TU, q + 1
      kind, wait, req, debited, id = dkind, dwait, dreq, 1, q
    end
  end
  if rem > 0 then
    local w = min(floor((rem + 999) / 1000), bound)
    if kind ~= 3 and w > wait then kind, wait, req = 2, w, max(req, w) end
  end
end

local pending = 0
if debited == 1 and wait > 0 then
  redis.call('HSET', key, 'p' .. string.format('%d', id), string.format('%d', now + wait * 1000))
  pn = pn + 1
  pending = id
end

-- save: the state and its time to live.
if pn == 0 then pm = q + 1 end
redis.call('HSET', key, 'S', struct.pack('<ddddddddddddddd', u, t, q, pm, pn, rate, burst, bound, retries,
  ao and 1 or 0, ae, al, aq, ap, ai))
if legacy then redis.call('HDEL', key, 's') end
local ttl = tonumber(ARGV[3])
if enabled and u < cap then ttl = ttl + floor((floor((cap - u + rate - 1) / rate) + 999999) / 1000000) end
if ao and prate > 0 and ae < prate then
  ttl = ttl + (floor((prate - ae) / max(1, floor(prate / 10))) + 1) * RAISE_EVERY / 1000
end
if ao and ap > now then ttl = ttl + floor((ap - now + 999) / 1000) end
redis.call('PEXPIRE', key, string.format('%d', ttl))
return {kind, wait, ra, req, debited, relaxed, id, pver, pending}
