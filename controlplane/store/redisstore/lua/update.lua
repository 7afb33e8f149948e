-- update.lua: Memory.updateStored. KEYS: account, policies, version,
-- adaptive set, epoch. ARGV: account key, now (us), default record, idle
-- ms, the record the caller read ('' for none), the new record without
-- its version, the notification channel, this replica's id, the epoch the
-- caller serves under ('': none yet), the highest version the caller has
-- seen (the new version is past it: never behind a copy a replica holds,
-- even in a store that lost recent writes). Returns {-1} when the stored record
-- changed since the caller read it, {-2} when the store's epoch is not
-- the caller's (the store lost its data: heal first), {-3} when the
-- store-wide version is unreadable (the caller restores it), else a
-- snapshot.
-- An unreadable stored record is replaced (its old rate is unknown, so
-- adaptive mode starts over).
local now = tonumber(ARGV[2])
if ARGV[9] ~= '' and redis.call('GET', KEYS[5]) ~= ARGV[9] then return {-2} end
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if (cur or '') ~= ARGV[5] then return {-1} end
local ok, old = pcall(decode, cur or ARGV[3])
if not ok then old = {rate = -1} end
local okV, v = pcall(redis.call, 'INCR', KEYS[3])
if not okV then return {-3} end
if v <= tonumber(ARGV[10]) then
  v = tonumber(ARGV[10]) + 1
  redis.call('SET', KEYS[3], itoa(v))
end
local rec = itoa(v) .. ' ' .. ARGV[6]
local p = decode(rec)
p.custom = true
redis.call('HSET', KEYS[2], ARGV[1], rec)
-- an unreadable account state is started over, as a new account's
local okS, s = pcall(load, KEYS[1])
if not okS then s = nil end
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
