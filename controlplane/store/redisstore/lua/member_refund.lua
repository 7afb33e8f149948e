-- member_refund.lua: Memory.RefundMember. KEYS: the member's bucket.
-- ARGV: now (us). Gives one token back (capped at the burst): the account
-- refused the admission the member's token was taken for. Returns 1 when
-- the bucket exists, else 0.
local now = tonumber(ARGV[1])
local v = redis.call('HGET', KEYS[1], 's')
if not v then return 0 end
local u, t, q, r, bu, w, y = string.match(v, '^(%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+)$')
if not u then return 0 end
local b = {u = tonumber(u), t = tonumber(t), q = tonumber(q)}
apply(b, tonumber(r), tonumber(bu), tonumber(w), tonumber(y))
refund(b, now)
redis.call('HSET', KEYS[1], 's', string.format('%d %d %d %d %d %d %d', b.u, b.t, b.q, b.rate, b.burst, b.bound, b.retries))
return 1
