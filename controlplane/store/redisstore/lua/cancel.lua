-- cancel.lua: Memory.Cancel. KEYS: account. ARGV: reservation id, now
-- (us). Returns 1 when it refunded the reservation, else 0.
local now = tonumber(ARGV[2])
local s = load(KEYS[1])
if not s then return 0 end
local f = 'p' .. ARGV[1]
local dep = redis.call('HGET', KEYS[1], f)
if not dep or tonumber(dep) <= now then return 0 end
redis.call('HDEL', KEYS[1], f)
refund(s.b, now)
s.pn = s.pn - 1
putState(KEYS[1], s)
return 1
