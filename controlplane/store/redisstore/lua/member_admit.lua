-- member_admit.lua: Memory.AdmitMember. KEYS: the member's bucket. ARGV:
-- rate, burst, bound ms, retries (store.MemberPolicy), now (us), idle ms.
-- Returns kind, wait ms, retry-after s, required wait ms, debited,
-- relaxed, reservation id (as take). The bucket is one field 's', "u t q
-- rate burst bound retries"; a new one starts full, a changed policy
-- applies at once keeping the tokens.
local now = tonumber(ARGV[5])
local rate, burst, bound, retries = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local v = redis.call('HGET', KEYS[1], 's')
local b
if v then
  local u, t, q, r, bu, w, y = string.match(v, '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+)$')
  if not u then error('clodex: malformed member state ' .. v) end
  b = {u = tonumber(u), t = tonumber(t), q = tonumber(q)}
  apply(b, tonumber(r), tonumber(bu), tonumber(w), tonumber(y))
  if b.rate ~= math.min(math.max(rate, 0), 600) or b.burst ~= math.min(math.max(burst, 1), 1000)
      or b.bound ~= math.min(math.max(bound, 0), 15000) or b.retries ~= math.min(math.max(retries, 0), 10) then
    setPolicy(b, now, rate, burst, bound, retries)
  end
else
  b = {u = 0, t = now, q = 0}
  apply(b, rate, burst, bound, retries)
  b.u = b.cap
end
local d = take(b, now)
redis.call('HSET', KEYS[1], 's', string.format('%d %d %d %d %d %d %d', b.u, b.t, b.q, b.rate, b.burst, b.bound, b.retries))
local ttl = tonumber(ARGV[6])
if b.enabled and b.u < b.cap then
  ttl = ttl + idiv(idiv(b.cap - b.u + b.rate - 1, b.rate) + 999999, 1000000)
end
redis.call('PEXPIRE', KEYS[1], itoa(ttl))
return d
