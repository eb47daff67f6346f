"""The job record's transitions, one Lua script each; ``tide_fleet.infra.wire.jobstore`` calls them.

Lease fields on a job record: ``lease_token`` and ``lease_owner`` (the current holder),
``started_lease`` (the token of the lease under which computation began: that lease is
charged an attempt), ``attempts`` (leases that started computing, so the count people
see is work that ran) and ``lost_unstarted`` (leases that expired before a start mark: a
worker killed while only holding the job, or a poison job killing it in its first step).
"""

from __future__ import annotations

from tide_fleet.infra.wire.expiry_scripts import EXPIRE_DUE as EXPIRE_DUE_BODY
from tide_fleet.infra.wire.expiry_scripts import EXPIRY_PRELUDE
from tide_fleet.infra.wire.fair_scripts import FAIR_PRELUDE
from tide_fleet.infra.wire.fair_scripts import RESTORE_STRANDED as RESTORE_STRANDED

# Shared by the scripts below. Backlog accounting: a queued job is a member of the zset
# tide:backlog:<field> (score: created_at) and its prompt + n × max tokens (n choices share
# the prompt) are in the hash tide:backlog_tokens; the two change together, only when
# membership changes. The field is the record's `backlog` (protocol.backlog_field: the
# bucket for the default model, <lane>:<bucket> for another), else its bucket. A job with a
# deadline is also in tide:deadline_backlog:<field> (member '<id>:<tokens>', score: deadline).
# A job on a LoRA adapter (its record's `lora`) counts in tide:adapter_backlog too (adapter
# name -> queued jobs; a name leaves the hash at 0).
BASE_PRELUDE = """
local function backlog_field(jobkey)
  local f = redis.call('HMGET', jobkey, 'backlog', 'bucket')
  if f[1] and f[1] ~= '' then return f[1] end
  return f[2]
end

local function backlog(jobkey, job_id, add)
  local f = redis.call('HMGET', jobkey, 'bucket', 'prompt_tokens', 'max_tokens', 'created_at',
                       'n', 'deadline', 'lora')
  if not f[1] then return end
  f[1] = backlog_field(jobkey)
  local z = 'tide:backlog:' .. f[1]
  local tokens = tonumber(f[2] or '0') + tonumber(f[3] or '0') * tonumber(f[5] or '1')
  if f[6] and f[6] ~= '' then
    local dz, member = 'tide:deadline_backlog:' .. f[1], job_id .. ':' .. tokens
    if add then redis.call('ZADD', dz, tonumber(f[6]), member)
    else redis.call('ZREM', dz, member) end
  end
  local lora = f[7] and f[7] ~= '' and f[7]
  if add then
    if redis.call('ZADD', z, 'NX', tonumber(f[4] or '0'), job_id) == 1 then
      redis.call('HINCRBY', 'tide:backlog_tokens', f[1], tokens)
      if lora then redis.call('HINCRBY', 'tide:adapter_backlog', lora, 1) end
    end
  elseif redis.call('ZREM', z, job_id) == 1 then
    redis.call('HINCRBY', 'tide:backlog_tokens', f[1], 0 - tokens)  -- never -0
    if lora and redis.call('HINCRBY', 'tide:adapter_backlog', lora, -1) <= 0 then
      redis.call('HDEL', 'tide:adapter_backlog', lora)
    end
  end
  return tokens
end

-- A batch job reaching a terminal state counts once in its batch's record, so the batch
-- supervisor need not read every line's status each pass (infra/batches/supervise.py).
local function batch_terminal(jobkey, status)
  local b = redis.call('HGET', jobkey, 'batch_id')
  if b and b ~= '' then
    redis.call('HINCRBY', 'tide:batch:' .. b, 'jobs_terminal', 1)
    if status == 'completed' then
      redis.call('HINCRBY', 'tide:batch:' .. b, 'jobs_completed', 1)
    end
  end
end

-- One attempt per lease that started computing, however often its start is reported.
local function charge(jobkey, token)
  if redis.call('HGET', jobkey, 'started_lease') == token then return end
  redis.call('HSET', jobkey, 'started_lease', token)
  redis.call('HINCRBY', jobkey, 'attempts', 1)
end

-- The last event of a job's stream: SSE followers stop reading at it.
local function done_event(eventskey, ttl, status)
  if tonumber(ttl) > 0 then
    redis.call('XADD', eventskey, '*', 'type', 'done', 'status', status)
    redis.call('EXPIRE', eventskey, ttl)
  end
end
"""
PRELUDE = BASE_PRELUDE + FAIR_PRELUDE + EXPIRY_PRELUDE

# The tenant's recent API jobs (KEYS[7], Keys.tenant_jobs), for the console's job list: a
# zset by created_at, trimmed to the newest RECENT_JOBS_PER_TENANT once it is RECENT_JOBS_SLACK
# over (so the trim runs once per that many creates), expiring with the job TTL after the
# tenant's last job. Batch lines are not listed (the batch is).
RECENT_JOBS_PER_TENANT = 1000
RECENT_JOBS_SLACK = 100

CREATE = (
    PRELUDE
    + """local calls = redis.call('INCR', KEYS[5])
if calls == 1 then redis.call('EXPIRE', KEYS[5], 2) end
if calls > tonumber(ARGV[3]) then return {'rate'} end
if ARGV[1] ~= '' then
  local existing = redis.call('GET', KEYS[2])
  if existing then
    local f = redis.call('HMGET', 'tide:job:' .. existing, 'status', 'bucket', 'created_at')
    if f[1] then return {'exists', existing, f[1], f[2], f[3]} end
  end
end
if tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[5]) then
  return {'tenant_full'}
end
local waiting = redis.call('LLEN', KEYS[4]) + redis.call('ZCARD', KEYS[4] .. ':deadlines')
  + tonumber(redis.call('GET', KEYS[4] .. ':waiting') or '0')
if waiting >= tonumber(ARGV[6]) then return {'queue_full'} end
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ARGV[4])
if ARGV[1] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[4]) end
redis.call('INCR', KEYS[3])
local own = redis.call('HMGET', KEYS[1], 'batch_id', 'created_at')
if not own[1] or own[1] == '' then
  redis.call('ZADD', KEYS[7], tonumber(own[2] or '0'), ARGV[2])
  if redis.call('ZCARD', KEYS[7]) > RECENT_CAP + RECENT_SLACK then
    redis.call('ZREMRANGEBYRANK', KEYS[7], 0, -RECENT_CAP - 1)
  end
  redis.call('EXPIRE', KEYS[7], ARGV[4])
end
local tokens = backlog(KEYS[1], ARGV[2], true)
local bucket = backlog_field(KEYS[1])
redis.call('HINCRBY', 'tide:arrived_tokens', bucket, tokens)
redis.call('HINCRBY', 'tide:arrived_jobs', bucket, 1)
push_message(KEYS[1], ARGV[2], false)
return {'created', ARGV[2]}
""".replace("RECENT_CAP", str(RECENT_JOBS_PER_TENANT)).replace(
        "RECENT_SLACK", str(RECENT_JOBS_SLACK)
    )
)

# Taking the lease charges nothing: the worker may only hold the job (prefetched, waiting
# for the engine to schedule it). MARK_STARTED charges the attempt. A job past its expiry
# (deadline or ttl) is never started: it ends as expired here. ARGV[6]: events TTL.
ACQUIRE = (
    PRELUDE
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing'} end
if st ~= 'queued' then return {st} end
local exp = redis.call('HGET', KEYS[1], 'expire_at')
if exp and exp ~= '' and tonumber(exp) <= tonumber(ARGV[3]) then
  expire_job(KEYS[1], ARGV[5], ARGV[3], ARGV[6] or '0')
  return {'expired'}
end
redis.call('HSET', KEYS[1], 'status', 'in_progress', 'lease_token', ARGV[2],
           'lease_owner', ARGV[1], 'started_at', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('ZREM', 'tide:expiries', ARGV[5])  -- started: it cannot expire (a requeue adds it back)
backlog(KEYS[1], ARGV[5], false)
local record = redis.call('HGETALL', KEYS[1])
table.insert(record, 1, 'acquired')
return record
"""
)

MARK_STARTED = (
    PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
charge(KEYS[1], ARGV[1])
return 1
"""
)

REFRESH = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 'lost' end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return redis.call('HGET', KEYS[1], 'cancel_requested') or '0'
"""

UPDATE_IF_HOLDER = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""

# A token delta on the job's event stream, from its lease holder only: a stale holder's
# output never lands in front of the tokens its successor resumes from. ARGV: lease token,
# then the event's field/value pairs.
DELTA = """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
return 1
"""

# ARGV: lease token, job id, events TTL (0: no 'done' event), then field/value pairs with
# 'status' first. The 'done' event is written only by the holder that won. A completed
# job did compute, so it is charged its attempt even if its start mark never came. Its
# tenant's fair-share counter is settled to the tokens its usage counts (fair_scripts.py).
FINISH = (
    PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 0 end
if ARGV[5] == 'completed' then charge(KEYS[1], ARGV[1]) end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
fair_settle(KEYS[1], nil)
redis.call('HDEL', KEYS[1], 'lease_token')
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('DECR', KEYS[3])
batch_terminal(KEYS[1], ARGV[5])
done_event(KEYS[4], ARGV[3], ARGV[5])
return 1
"""
)

# A drain hand-back is never the job's fault: a started lease gives its attempt back.
REQUEUE = (
    PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'started_lease') == ARGV[1] then
  redis.call('HINCRBY', KEYS[1], 'attempts', -1)
end
redis.call('HSET', KEYS[1], 'status', 'queued')
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_owner', 'started_lease')
redis.call('ZREM', KEYS[2], ARGV[2])
backlog(KEYS[1], ARGV[2], true)
push_message(KEYS[1], ARGV[2], true)
return 1
"""
)

CANCEL = (
    PRELUDE
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished_at', ARGV[1],
             'finish_reason', 'abort')
  redis.call('DECR', KEYS[2])
  backlog(KEYS[1], ARGV[2], false)
  drop_deadline_message(KEYS[1])
  redis.call('ZREM', 'tide:expiries', ARGV[2])
  fair_settle(KEYS[1], 0)
  batch_terminal(KEYS[1], 'cancelled')
  return 'cancelled'
end
if st == 'in_progress' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'cancelling'
end
return st
"""
)

# KEYS: job, leases, tenant active, events. ARGV: job id, now, max_attempts, the cap on
# losses before a start mark, events TTL. A lease that started was charged when it
# started; one that never did counts in lost_unstarted instead, under its own cap.
REAP = (
    PRELUDE
    + """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not expiry or tonumber(expiry) > tonumber(ARGV[2]) then return 'alive' end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then return 'stale' end
local f = redis.call('HMGET', KEYS[1], 'lease_token', 'started_lease', 'cancel_requested',
                     'attempts', 'lost_unstarted')
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_owner', 'started_lease')
local function finish(status, ...)
  redis.call('HSET', KEYS[1], 'status', status, 'finished_at', ARGV[2], ...)
  redis.call('DECR', KEYS[3])
  batch_terminal(KEYS[1], status)
  done_event(KEYS[4], ARGV[5], status)
  return status
end
if f[3] == '1' then return finish('cancelled', 'finish_reason', 'abort') end
local attempts = tonumber(f[4] or '0')
local unstarted = tonumber(f[5] or '0')
local started = f[1] and f[1] == f[2]
if not started then
  unstarted = redis.call('HINCRBY', KEYS[1], 'lost_unstarted', 1)
end
if (started and attempts >= tonumber(ARGV[3])) or unstarted >= tonumber(ARGV[4]) then
  return finish('failed', 'error', 'worker lost the job ' .. (attempts + unstarted) ..
    ' times: ' .. attempts .. ' while running it (max_attempts ' .. ARGV[3] .. '), ' ..
    unstarted .. ' before it started (limit ' .. ARGV[4] .. ')')
end
redis.call('HSET', KEYS[1], 'status', 'queued')
backlog(KEYS[1], ARGV[1], true)
push_message(KEYS[1], ARGV[1], true)
return 'requeued'
"""
)

# A queued job past its expiry ends as expired (the reaper's pass; see expiry_scripts.py).
EXPIRE_DUE = PRELUDE + EXPIRE_DUE_BODY
