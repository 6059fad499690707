-- One decision on one bucket, atomically: the transcription of
-- `Level::at` and `Level::take` (throttle-layer/src/bucket/level.rs).
-- KEYS[1]: the bucket, a hash of t (tokens), k (their fill tick),
--          f (when full again, us) and b (blocked).
-- ARGV: capacity, quantum, interval (us), n, now (us; empty: the server's
--       clock), op ("take" or "peek").
-- Returns {0, tokens left} taken (or the level, for "peek"),
--         {1, us to wait}, {2, 0} blocked, {3, 0} more than the capacity.
local cap = tonumber(ARGV[1])
local quantum = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
-- Keys expire on the server's clock only: another clock's time (an
-- injected one, in tests) says nothing of when the server should drop it.
local expires = not now
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local h = redis.call('HMGET', KEYS[1], 't', 'k', 'b')
local tick = math.floor(now / interval)
local tokens = cap
if h[1] then
  local last = tonumber(h[2])
  if tick < last then tick = last end
  tokens = math.min(cap, tonumber(h[1]) + (tick - last) * quantum)
end
if ARGV[6] == 'peek' then return {0, tokens} end
if h[3] then return {2, 0} end
if n > cap then return {3, 0} end
if tokens < n then
  return {1, (tick + math.ceil((n - tokens) / quantum)) * interval - now}
end
tokens = tokens - n
local full = (tick + math.ceil((cap - tokens) / quantum)) * interval
redis.call('HSET', KEYS[1], 't', tokens, 'k', tick, 'f', full)
if expires then
  redis.call('PEXPIRE', KEYS[1], math.floor((full - now) / 1000) + 1)
end
return {0, tokens}
