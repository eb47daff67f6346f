"""Lua for tenant-fair queues: within one job queue, tenants share service by tokens.

Each job queue (protocol ``queue_name``) keeps its jobs without a deadline in one list per
tenant (``Keys.tenant_queue``, kombu's message envelope, RPOP end first) and a zset of the
tenants that have one waiting (``Keys.queue_tenants``), scored by each tenant's virtual
counter: weighted tokens served, over the tenant's weight (the record's ``share_weight``,
from settings ``tenant_weights``, default 1). A take serves the tenant with the least
counter and charges it the job's cost, prompt + n x max tokens (start-time fair queuing). A
tenant joining the zset starts at the current minimum, so idle time earns no credit; one
whose list empties leaves it. ``Keys.queue_waiting`` counts the messages in the lists so a
queue's depth stays three O(1) reads.

The charge is an estimate; the job record remembers it (``fair_queue``, ``fair_charge``,
written by the take) until the job ends, when ``fair_settle`` corrects the counter to the
tokens served: its usage, prompt + completion tokens, over the weight (a queued job
cancelled or expired after a take was served none). The correction applies only while the
tenant is still in the zset: one that left is skipped (it rejoins at the minimum anyway).
A refund (this or any other) never takes a counter below the one its tenant joined at
(``Keys.queue_joined``, the zset's minimum then), so a tenant that left and came back while
its job ran cannot buy priority the start-time rule would not give; one that stayed is
corrected in full, as its counter with exact charges could not be lower. A job the reaper
ends keeps its charge: its output is not known.

A message going back (give-back, requeue, reap, restore) returns to the front of its
tenant's list and its outstanding charge is refunded (likewise) and forgotten, so a job
taken again is settled once, against its last charge. A cancelled or expired job's message
stays where it is, as on kombu's list: it is skipped at pickup and charged nothing at take.
"""

from __future__ import annotations

FAIR_PRELUDE = """
local function fair_num(v, default)
  return tonumber(v) or default
end

-- The tenant and weighted cost of a queued job (nil, 0 for any other).
local function fair_cost(jobkey)
  local f = redis.call('HMGET', jobkey, 'status', 'tenant', 'prompt_tokens', 'max_tokens',
                       'n', 'share_weight')
  if f[1] ~= 'queued' or not f[2] then return nil, 0 end
  local tokens = fair_num(f[3], 0) + fair_num(f[4], 0) * fair_num(f[5], 1)
  local weight = fair_num(f[6], 1)
  if weight <= 0 then weight = 1 end
  return f[2], tokens / weight
end

-- Charge (or refund, cost < 0) a tenant still waiting in the queue; what was charged. A
-- refund never takes the counter below the one the tenant joined at.
local function fair_charge(queue, tenant, cost)
  if not tenant or tenant == '' or cost == 0 then return 0 end
  local score = tonumber(redis.call('ZSCORE', queue .. ':tenants', tenant))
  if not score then return 0 end
  if cost < 0 then
    local joined = fair_num(redis.call('HGET', queue .. ':joined', tenant), score + cost)
    cost = math.max(cost, math.min(joined, score) - score)
  end
  if cost ~= 0 then redis.call('ZINCRBY', queue .. ':tenants', cost, tenant) end
  return cost
end

-- A message onto its tenant's list (front: where RPOP takes next), the tenant into the
-- waiting zset at the current minimum if it was idle, else less `refund` (a charge given
-- back: an idle tenant rejoins at the minimum, no lower).
local function fair_push(queue, tenant, m, front, refund)
  local list, tz = queue .. ':t:' .. tenant, queue .. ':tenants'
  if front then redis.call('RPUSH', list, m) else redis.call('LPUSH', list, m) end
  redis.call('INCR', queue .. ':waiting')
  if not redis.call('ZSCORE', tz, tenant) then
    local low = redis.call('ZRANGE', tz, 0, 0, 'WITHSCORES')
    redis.call('ZADD', tz, fair_num(low[2], 0), tenant)
    redis.call('HSET', queue .. ':joined', tenant, fair_num(low[2], 0))
  elseif refund then
    fair_charge(queue, tenant, -refund)
  end
end

-- The next message of the tenant with the least counter, and that tenant (nil if none).
-- `pop` takes a message off the tenant's list (default: RPOP, its front).
local function fair_pop(queue, pop)
  local tz = queue .. ':tenants'
  while true do
    local low = redis.call('ZRANGE', tz, 0, 0)
    if #low == 0 then return nil, nil end
    local list = queue .. ':t:' .. low[1]
    local m
    if pop then m = pop(list) else m = redis.call('RPOP', list) end
    if redis.call('LLEN', list) == 0 then
      redis.call('ZREM', tz, low[1])
      redis.call('HDEL', queue .. ':joined', low[1])
    end
    if m then
      redis.call('DECR', queue .. ':waiting')
      return m, low[1]
    end
  end
end

-- The job's outstanding charge, forgotten: what to refund to `queue`'s tenant (0 if none).
local function fair_refund(jobkey, queue)
  local f = redis.call('HMGET', jobkey, 'fair_queue', 'fair_charge')
  if not f[1] then return 0 end
  redis.call('HDEL', jobkey, 'fair_queue', 'fair_charge')
  if f[1] ~= queue then return 0 end
  return fair_num(f[2], 0)
end

-- The job ended: its tenant's counter corrected from the charge to `served` tokens (nil:
-- its usage, prompt + completion) over its weight, if the tenant is still waiting.
local function fair_settle(jobkey, served)
  local f = redis.call('HMGET', jobkey, 'fair_queue', 'fair_charge', 'tenant', 'share_weight',
                       'prompt_tokens', 'completion_tokens')
  if not f[1] then return end
  redis.call('HDEL', jobkey, 'fair_queue', 'fair_charge')
  local charged = fair_num(f[2], 0)
  if charged == 0 then return end
  local weight = fair_num(f[4], 1)
  if weight <= 0 then weight = 1 end
  served = served or fair_num(f[5], 0) + fair_num(f[6], 0)
  fair_charge(f[1], f[3], served / weight - charged)
end
"""

# KEYS: unacked, unacked index. ARGV: sextuples (queue, message, deadline or '', tenant or
# '', charged (unused: the job's record says what is still charged), delivery tag), the
# last to go back first. Each returns to the front: a deadline job to its queue's deadline
# zset, a tenant's to its list, any other to the list; the job's recorded charge is
# refunded and forgotten.
GIVE_BACK = (
    FAIR_PRELUDE
    + """
for i = 1, #ARGV, 6 do
  local q, m, d, t = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  -- What is still recorded on the job (a cancel or expiry since the take refunded it).
  local headers = cjson.decode(m)['headers']
  local c = 0
  if type(headers) == 'table' and headers['job_id'] then
    c = fair_refund('tide:job:' .. headers['job_id'], q)
  end
  if d ~= '' then
    redis.call('ZADD', q .. ':deadlines', tonumber(d), m)
    fair_charge(q, t, -c)
  elseif t ~= '' then
    fair_push(q, t, m, true, c)
  else
    redis.call('RPUSH', q, m)
  end
  redis.call('ZREM', KEYS[2], ARGV[i + 5])
  redis.call('HDEL', KEYS[1], ARGV[i + 5])
  redis.call('PUBLISH', 'tide:wakeup', q)
end
return 1
"""
)

# KEYS: unacked, unacked index, job, queue, its deadline zset. ARGV: tag, message. A
# message taken but never started goes back to the front: a deadline job's to the
# queue's deadline zset (KEYS[5]), any other to its tenant's list (KEYS[4]: the queue),
# the take's charge refunded.
RESTORE_STRANDED = (
    FAIR_PRELUDE
    + """
if redis.call('HGET', KEYS[3], 'status') ~= 'queued' then return 0 end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
local tenant = fair_cost(KEYS[3])
local cost = fair_refund(KEYS[3], KEYS[4])
local deadline = redis.call('HGET', KEYS[3], 'deadline')
if deadline and deadline ~= '' then
  redis.call('ZADD', KEYS[5], tonumber(deadline), ARGV[2])
  fair_charge(KEYS[4], tenant, -cost)
else
  fair_push(KEYS[4], tenant, ARGV[2], true, cost)
end
redis.call('PUBLISH', 'tide:wakeup', KEYS[4])
return 1
"""
)
