-- update.lua: Memory.updateStored. KEYS: account, policies, version,
-- adaptive set. ARGV: account key, now (us), default record, idle ms, the
-- record the caller read ('' for none), the new record without its
-- version, the notification channel, this replica's id. Returns {-1} when the stored record
-- changed since the caller read it, else a snapshot.
local now = tonumber(ARGV[2])
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if (cur or '') ~= ARGV[5] then return {-1} end
local old = decode(cur or ARGV[3])
local v = redis.call('INCR', KEYS[3])
local rec = itoa(v) .. ' ' .. ARGV[6]
local p = decode(rec)
p.custom = true
redis.call('HSET', KEYS[2], ARGV[1], rec)
local s = load(KEYS[1])
if not s then
  s = create(p, now)
else
  -- A new configured rate or mode starts adaptive mode over; a budget
  -- change keeps its effective rate.
  if old.rate ~= p.rate or s.a.on ~= p.adaptive then aReset(s.a, p.adaptive, p.rate, now) end
  setPolicy(s.b, now, aRate(s.a, p.rate), p.burst, p.bound, p.retries)
end
if p.adaptive then
  redis.call('SADD', KEYS[4], ARGV[1])
else
  redis.call('SREM', KEYS[4], ARGV[1])
end
save(KEYS[1], s, p.rate, now, tonumber(ARGV[4]))
redis.call('PUBLISH', ARGV[7], ARGV[1] .. ' ' .. itoa(v) .. ' ' .. ARGV[8])
return snapshot(s, p, rec, now)
