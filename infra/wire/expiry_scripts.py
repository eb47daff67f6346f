"""Lua for deadlines and expiry: where a job's message goes, and how a queued job expires.

A job with a ``deadline`` (unix seconds) has its message in its queue's deadline zset
(``Keys.deadline_queue``, scored by the deadline) instead of the kombu list: the take
script (infra/wire/queues.py) reads that zset first, earliest deadline first. A job with an
``expire_at`` (its deadline, or created_at + ttl) is listed in ``Keys.expiries``; a queued
job past it ends as ``expired``, in the reaper's pass (``EXPIRE_DUE``) or when a worker
acquires it (infra/wire/job_scripts.py ACQUIRE), and is never started.

EXPIRY_PRELUDE is appended to the job scripts' prelude: it uses their ``backlog``,
``backlog_field``, ``batch_terminal`` and ``done_event``, and fair_scripts.py's prelude.
"""

from __future__ import annotations

EXPIRY_PRELUDE = """
-- The job's message into its queue (and the job into tide:expiries if it may expire): a
-- deadline job into the queue's deadline zset, any other onto its tenant's list
-- (fair_scripts.py), at the end RPOP takes first (front) or last. A job going back to the
-- front (requeue, reap) was charged when it was taken: the charge is refunded.
local function push_message(jobkey, job_id, front)
  local f = redis.call('HMGET', jobkey, 'queue', 'message', 'deadline', 'expire_at', 'tenant')
  local refund = 0
  if front then refund = fair_refund(jobkey, f[1]) end
  if f[3] and f[3] ~= '' then
    redis.call('ZADD', f[1] .. ':deadlines', tonumber(f[3]), f[2])
    fair_charge(f[1], f[5], -refund)
  else
    fair_push(f[1], f[5] or '', f[2], front, refund)
  end
  if f[4] and f[4] ~= '' then redis.call('ZADD', 'tide:expiries', tonumber(f[4]), job_id) end
  redis.call('PUBLISH', 'tide:wakeup', f[1])
end

-- A list message is skipped at pickup (its job is no longer queued); a zset one is removed.
local function drop_deadline_message(jobkey)
  local f = redis.call('HMGET', jobkey, 'queue', 'message', 'deadline')
  if f[3] and f[3] ~= '' then redis.call('ZREM', f[1] .. ':deadlines', f[2]) end
end

-- A queued job past its expiry ends, never started and charged nothing (a take's charge
-- is settled at 0 served): released from its tenant's count and the backlog, counted, its
-- 'done' event and its webhook (the msg id is infra/jobs/webhooks.py event_id's) written.
local function expire_job(jobkey, job_id, now, events_ttl)
  fair_settle(jobkey, 0)
  local f = redis.call('HMGET', jobkey, 'tenant', 'deadline', 'webhook_url')
  local why = 'ttl'
  if f[2] and f[2] ~= '' and tonumber(f[2]) <= tonumber(now) then why = 'deadline' end
  redis.call('HSET', jobkey, 'status', 'expired', 'finished_at', now,
             'error', 'expired: its ' .. why .. ' passed before any worker started it')
  redis.call('DECR', 'tide:tenant:' .. f[1] .. ':active')
  redis.call('HINCRBY', 'tide:expired_jobs', backlog_field(jobkey), 1)
  backlog(jobkey, job_id, false)
  drop_deadline_message(jobkey)
  redis.call('ZREM', 'tide:expiries', job_id)
  batch_terminal(jobkey, 'expired')
  done_event('tide:events:' .. job_id, events_ttl, 'expired')
  if f[3] and f[3] ~= '' then
    local msg = 'msg_' .. job_id .. '_expired'
    redis.call('HSET', 'tide:webhook:' .. msg, 'kind', 'job', 'obj_id', job_id)
    redis.call('ZADD', 'tide:webhooks:due', 'NX', tonumber(now), msg)
  end
end
"""

# KEYS: job, expiries. ARGV: job id, now, events TTL. An entry for a job no longer queued
# (running, finished, or its record gone) is dropped; a re-queue lists it again.
EXPIRE_DUE = """
local at = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not at or tonumber(at) > tonumber(ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'status') ~= 'queued' then return 0 end
expire_job(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
return 1
"""
