-- Puts a bucket on its service's block list (ARGV[1] "1") or takes it
-- off ("0"). KEYS[1]: the bucket (see take.lua). ARGV[2]: now (us; empty:
-- the server's clock). A blocked bucket never expires; unblocked, it
-- expires when full again (on the server's clock), at once if it already
-- is.
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[1], 'b', 1)
  redis.call('PERSIST', KEYS[1])
  return {1}
end
redis.call('HDEL', KEYS[1], 'b')
local full = tonumber(redis.call('HGET', KEYS[1], 'f'))
if not full then
  redis.call('DEL', KEYS[1])
  return {0}
end
local now = tonumber(ARGV[2])
local expires = not now
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
if full <= now then
  redis.call('DEL', KEYS[1])
elseif expires then
  -- On the server's clock only, as in take.lua.
  redis.call('PEXPIRE', KEYS[1], math.floor((full - now) / 1000) + 1)
end
return {0}
