-- usage.lua: Store.PutUsage, one batch of an agent's usage rows.
-- KEYS[1]: the batch's dedup key; then, for each distinct minute of the
-- batch, its minute hash and its hour hash (KEYS[2i], KEYS[2i+1]).
-- ARGV[1]: the dedup key's lifetime (s); ARGV[2]: the hashes' lifetime
-- (s); ARGV[3]: the rows cap of a minute hash; ARGV[4]: of an hour hash;
-- ARGV[5]: the field prefix of the row the rows past a cap fold into;
-- then 8 values per row: the index i of its minute, its field prefix
-- (member US agent US account US model US) and its six counts (turns,
-- input, cached, output, new sockets, refusals).
-- A row is six fields, its prefix followed by t, i, c, o, s and r.
-- Returns 1 when the batch was applied, 0 when it had been already.
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local letters = {'t', 'i', 'c', 'o', 's', 'r'}
local function put(h, cap, prefix, n)
  if redis.call('HEXISTS', h, prefix .. 't') == 0 and redis.call('HLEN', h) >= cap * 6 then
    prefix = ARGV[5]
  end
  for j = 1, 6 do
    redis.call('HINCRBY', h, prefix .. letters[j], ARGV[n + j])
  end
end
local minuteCap, hourCap = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = 6
while n < #ARGV do
  local i = tonumber(ARGV[n])
  put(KEYS[2 * i], minuteCap, ARGV[n + 1], n + 1)
  put(KEYS[2 * i + 1], hourCap, ARGV[n + 1], n + 1)
  n = n + 8
end
for k = 2, #KEYS do
  redis.call('EXPIRE', KEYS[k], ARGV[2])
end
return 1
