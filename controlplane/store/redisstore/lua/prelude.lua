-- prelude.lua: the bucket and adaptive-mode math of internal/pacing and
-- controlplane/store, mirrored for Redis. Every script is this prelude
-- followed by one body.
--
-- Numbers are Lua doubles, so every value is kept an integer below 2^53:
-- instants are microseconds since the Unix epoch (Redis TIME's
-- resolution); tokens are units of 1/60e9 of a token, as in pacing, so a
-- bucket refilling at R tokens a minute gains exactly R units a
-- nanosecond. The largest magnitudes are the capacity, 1000 x 6e10 = 6e13,
-- and the floor, -15e9 ns x 600 = -9e12. A floor division of two such
-- integers is exact (math.floor(a / b) cannot round across an integer
-- while |a| < 2^53).

local TU = 60000000000 -- units per token
local NS = 1000        -- nanoseconds per microsecond
local LOWER_EVERY = 10000000 -- adaptive: 10 s in microseconds
local RAISE_EVERY = 30000000 -- adaptive: 30 s in microseconds
local PAUSE = 60000000       -- adaptive: the first learned pause, 1 min in microseconds
local MAX_PAUSE = 240000000  -- adaptive: the longest learned pause, 4 min in microseconds
local FAR = 1e15 -- an elapsed time (ns) longer than any refill

local function idiv(a, b) return math.floor(a / b) end

-- itoa formats an integer exactly (tostring would switch to an exponent
-- above 14 digits).
local function itoa(x) return string.format('%d', x) end

-- decode parses a policy record "version rate burst idle_ms total_ms
-- retries bound_ms adaptive" (integers; adaptive 0 or 1).
local function decode(rec)
  local v, r, b, i, t, y, w, a = string.match(rec,
    '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ([01])$')
  if not v then error('clodex: malformed policy record ' .. rec) end
  return {version = tonumber(v), rate = tonumber(r), burst = tonumber(b), idle = tonumber(i),
    total = tonumber(t), retries = tonumber(y), bound = tonumber(w), adaptive = a == '1'}
end

-- policy returns the account's record (custom) or the default one.
local function policy(policies, name, default)
  local rec = redis.call('HGET', policies, name)
  if rec then
    local p = decode(rec)
    p.custom = true
    return p, rec
  end
  local p = decode(default)
  p.custom = false
  return p, false
end

-- Bucket (pacing.Bucket). b has the fields u (units), t (updated, us),
-- q (the latest reservation id) and the applied policy: rate, burst,
-- bound (ms), retries; apply derives the rest.
local function apply(b, rate, burst, boundMs, retries)
  rate = math.min(math.max(rate, 0), 600)
  burst = math.min(math.max(burst, 1), 1000)
  retries = math.min(math.max(retries, 0), 10)
  boundMs = math.min(math.max(boundMs, 0), 15000)
  b.rate, b.burst, b.bound, b.retries = rate, burst, boundMs, retries
  b.enabled = rate > 0 and boundMs > 0
  b.hint = math.max(idiv(boundMs, 1000), 1)
  b.canRefuse = boundMs > 0 and retries * b.hint * 1000 * rate >= 60000
  b.cap = burst * TU
  b.boundNs = boundMs * 1000000
  b.floor = -b.boundNs * rate
end

local function refilled(b, elapsed)
  local gap = b.cap - b.u
  if elapsed > idiv(gap, b.rate) then return b.cap end
  return b.u + elapsed * b.rate
end

local function elapsedNs(from, to)
  local d = to - from
  if d > FAR / NS then return FAR end
  return d * NS
end

local function advance(b, now)
  if now <= b.t then return end
  local e = elapsedNs(b.t, now)
  b.t = now
  b.u = refilled(b, e)
end

local function ceilMs(ns) return idiv(ns + 999999, 1000000) end

-- take is pacing.Bucket.Take. It returns kind (1 admit, 2 wait, 3 refuse),
-- wait ms, retry-after s, required wait ms, debited (0/1), relaxed (0/1)
-- and the reservation id (0 when nothing was debited).
local function take(b, now)
  if not b.enabled then return {1, 0, 0, 0, 0, 0, 0} end
  advance(b, now)
  local function debit(kind, wait, required)
    b.u = b.u - TU
    b.q = b.q + 1
    return {kind, wait, 0, required, 1, 0, b.q}
  end
  if b.u >= TU then return debit(1, 0, 0) end
  local need = TU - b.u
  local w = idiv(need + b.rate - 1, b.rate)
  if need <= -b.floor then return debit(2, ceilMs(w), ceilMs(w)) end
  if b.canRefuse then return {3, 0, b.hint, ceilMs(w), 0, 0, 0} end
  if b.u > b.floor then return debit(2, b.bound, ceilMs(w)) end
  return {1, 0, 0, 0, 0, 1, 0}
end

-- refund is pacing.Bucket.Refund.
local function refund(b, now)
  if not b.enabled then return end
  advance(b, now)
  b.u = math.min(b.u + TU, b.cap)
end

-- setPolicy is pacing.Bucket.SetPolicy.
local function setPolicy(b, now, rate, burst, boundMs, retries)
  local was = b.enabled
  if was then advance(b, now) end
  apply(b, rate, burst, boundMs, retries)
  if not was then b.u = b.cap end
  b.u = math.min(b.u, b.cap)
  if now > b.t or not was then b.t = now end
end

-- tokens is pacing.Bucket.Tokens in units.
local function tokens(b, now)
  if b.enabled and now > b.t then return refilled(b, elapsedNs(b.t, now)) end
  return b.u
end

-- Adaptive mode (store/adaptive.go): a.on, a.eff, a.low (-1: never
-- lowered), a.quiet (us), a.pu (the pause's end, us; 0: none), a.li (the
-- learned pause, us; 0: PAUSE).
local function aReset(a, on, configured, now)
  a.on, a.eff, a.low, a.quiet, a.pu, a.li = on, configured, -1, now, 0, 0
end

local function aRate(a, configured)
  if not a.on or configured == 0 then return configured end
  return math.min(a.eff, configured)
end

-- aPaused returns the pause's end when admissions at now are paused.
local function aPaused(a, now)
  if a.on and a.pu > now then return a.pu end
  return nil
end

local function aAdvance(a, configured, now)
  if not a.on or configured == 0 or a.eff >= configured then return false end
  local old = a.eff
  local step = math.max(1, idiv(configured, 10))
  while a.eff < configured and now - a.quiet >= RAISE_EVERY do
    a.eff = math.min(configured, a.eff + step)
    a.quiet = a.quiet + RAISE_EVERY
  end
  if a.eff >= configured then a.li = 0 end
  return a.eff ~= old
end

-- aOn403 is adaptive.on403; ra is the 403's retry-after (us, 0: none).
local function aOn403(a, configured, now, ra)
  if not a.on or configured == 0 then return false end
  aAdvance(a, configured, now)
  local changed = false
  if ra > 0 then
    if now + ra > a.pu then a.pu, changed = now + ra, true end
  elseif a.pu == 0 or now >= a.pu then
    if a.li == 0 then a.li = PAUSE end
    if a.pu ~= 0 and now - a.pu < a.li then a.li = math.min(2 * a.li, MAX_PAUSE) end
    a.pu, changed = now + a.li, true
  end
  local q = math.max(now, a.pu)
  if q > a.quiet then a.quiet = q end
  if a.low ~= -1 and now - a.low < LOWER_EVERY then return changed end
  a.low = now
  local old = a.eff
  a.eff = math.max(1, idiv(a.eff, 2))
  return changed or a.eff ~= old
end

-- The account key: one hash per account. Field 'S' packs the state as
-- 15 little-endian doubles (struct, which Redis ships; every value is an
-- integer below 2^53, so exact), "u t q pm pn r b w y ao ae al aq ap ai"
-- (one field to read and write instead of fifteen, and no text to parse);
-- fields 'p' .. id are pending reservations. admit.lua reads and writes
-- the same layout without this prelude (STATE_FMT, STATE_LEN). Field 's'
-- is the state as earlier versions wrote it, 15 decimal integers (13
-- before the pause): read when 'S' is missing, and replaced by 'S' on the
-- next write.
local STATE_FMT, STATE_LEN = '<ddddddddddddddd', 120
local LEGACY = '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) ([01]) (%-?%d+) (%-?%d+) (%-?%d+) ?(%-?%d*) ?(%-?%d*)$'

-- load returns the account's state, or nil when the key does not exist.
-- s.pm is the lowest reservation id that may still be pending and s.pn
-- the number of pending reservations; s.legacy is set when it was read
-- from field 's'.
local function load(key)
  local u, t, q, pm, pn, r, b, w, y, ao, ae, al, aq, ap, ai
  local legacy = false
  local v = redis.call('HGET', key, 'S')
  if v then
    if #v ~= STATE_LEN then error('clodex: malformed account state of ' .. #v .. ' bytes') end
    u, t, q, pm, pn, r, b, w, y, ao, ae, al, aq, ap, ai = struct.unpack(STATE_FMT, v)
    if not (t == t and u == u and r >= 0 and r <= 600 and b >= 1 and b <= 1000 and w >= 0 and w <= 15000
        and y >= 0 and y <= 10) then
      error('clodex: malformed account state (values out of range)')
    end
    ao = ao == 1 and '1' or '0'
  else
    v = redis.call('HGET', key, 's')
    if not v then return nil end
    u, t, q, pm, pn, r, b, w, y, ao, ae, al, aq, ap, ai = string.match(v, LEGACY)
    if not u then error('clodex: malformed account state ' .. v) end
    legacy = true
  end
  local s = {a = {}, pm = tonumber(pm), pn = tonumber(pn), legacy = legacy}
  s.b = {u = tonumber(u), t = tonumber(t), q = tonumber(q)}
  apply(s.b, tonumber(r), tonumber(b), tonumber(w), tonumber(y))
  s.a.on, s.a.eff, s.a.low, s.a.quiet = ao == '1', tonumber(ae), tonumber(al), tonumber(aq)
  s.a.pu, s.a.li = tonumber(ap) or 0, tonumber(ai) or 0
  return s
end

-- putState writes the state as load reads it (and drops a legacy field).
local function putState(key, s)
  local b, a = s.b, s.a
  redis.call('HSET', key, 'S', struct.pack(STATE_FMT, b.u, b.t, b.q, s.pm, s.pn,
    b.rate, b.burst, b.bound, b.retries, a.on and 1 or 0, a.eff, a.low, a.quiet, a.pu, a.li))
  if s.legacy then
    redis.call('HDEL', key, 's')
    s.legacy = false
  end
end

-- create returns a new account for policy p at now: a full bucket, and
-- adaptive mode started over at the configured rate.
local function create(p, now)
  local s = {a = {}, pm = 1, pn = 0}
  aReset(s.a, p.adaptive, p.rate, now)
  s.b = {u = 0, t = now, q = 0}
  apply(s.b, aRate(s.a, p.rate), p.burst, p.bound, p.retries)
  s.b.u = s.b.cap
  return s
end

-- sync brings the applied policy up to p (the configured policy at the
-- effective rate) when it differs: after an adaptive step, or a policy
-- written without this account's state. It reports whether it changed.
local function sync(s, p, now)
  local rate = aRate(s.a, p.rate)
  local b = s.b
  if b.rate == math.min(math.max(rate, 0), 600) and b.burst == math.min(math.max(p.burst, 1), 1000)
      and b.bound == math.min(math.max(p.bound, 0), 15000) and b.retries == math.min(math.max(p.retries, 0), 10) then
    return false
  end
  setPolicy(b, now, rate, p.burst, p.bound, p.retries)
  return true
end

-- save writes the account back with its time to live: long enough to
-- refill the bucket and recover an adaptive rate, plus idle ms, so that a
-- key expires only when a new account would behave the same.
local function save(key, s, configured, now, idle)
  local b, a = s.b, s.a
  if s.pn == 0 then s.pm = b.q + 1 end
  putState(key, s)
  local ttl = idle
  if b.enabled and b.u < b.cap then
    ttl = ttl + idiv(idiv(b.cap - b.u + b.rate - 1, b.rate) + 999999, 1000000)
  end
  if a.on and configured > 0 and a.eff < configured then
    ttl = ttl + (idiv(configured - a.eff, math.max(1, idiv(configured, 10))) + 1) * RAISE_EVERY / 1000
  end
  if a.on and a.pu > now then ttl = ttl + idiv(a.pu - now + 999, 1000) end
  redis.call('PEXPIRE', key, itoa(ttl))
end

-- prune forgets at most 64 reservations that departed by now, oldest id
-- first. A pending reservation is the field 'p' .. id, valued its
-- departure (us).
local function prune(key, s, now)
  local n = 0
  while s.pn > 0 and s.pm <= s.b.q and n < 64 do
    local f = 'p' .. itoa(s.pm)
    local dep = redis.call('HGET', key, f)
    if dep then
      if tonumber(dep) > now then break end
      redis.call('HDEL', key, f)
      s.pn = s.pn - 1
    end
    s.pm = s.pm + 1
    n = n + 1
  end
end

-- addPending records reservation id, departing at dep (us).
local function addPending(key, s, id, dep)
  redis.call('HSET', key, 'p' .. itoa(id), itoa(dep))
  s.pn = s.pn + 1
end

-- snapshot returns the account fields Go reads: version, custom, tokens
-- (units), effective rate, adaptive, the configured record, and the
-- pause's end (us; 0 when not paused).
local function snapshot(s, p, rec, now)
  return {p.version, p.custom and 1 or 0, tokens(s.b, now), s.b.rate, s.a.on and 1 or 0, rec or '',
    aPaused(s.a, now) or 0}
end
