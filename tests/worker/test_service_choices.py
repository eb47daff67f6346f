"""A job with n choices runs as n engine requests and is one job everywhere else: one lease,
one result (choice 0's text, summed tokens, every choice listed), one fate when it is
cancelled, fails, loses its lease or meets a Redis outage."""

from __future__ import annotations

import json

import pytest
import redis

from tests.conftest import make_engine
from tests.worker.service_driver import choices, run, service, submit
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.choices import SEED_RANGE, choice_params, pop_n
from tide_fleet.worker.engine import RequestOutput, SamplingParams

PROMPT = "once upon a time there was a worker that ran many choices"  # 59 tokens: 3 blocks


def test_n_choices_are_seeded_one_apart_and_written_as_one_result(
    redis_server, redis_client, tiny_path
):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, max_tokens=8, temperature=1.0, seed=7, n=3,
                    ignore_eos=True)  # fmt: skip
    record = run(worker, redis_client, job_id)
    assert record["status"] == "completed", record
    got = choices(record)
    assert [c["index"] for c in got] == [0, 1, 2]
    assert record["text"] == got[0]["text"] and record["finish_reason"] == got[0]["finish_reason"]
    assert [c["completion_tokens"] for c in got] == [8, 8, 8]
    assert record["completion_tokens"] == "24"  # the sum: what usage reports
    assert all(c["logprobs"] is None for c in got)  # not asked
    # Choice i samples exactly as a lone request seeded seed + i does.
    prompt = json.loads(record["token_ids"])
    engine = make_engine(tiny_path)
    seeded = [SamplingParams(max_tokens=8, seed=7 + i, ignore_eos=True) for i in range(3)]
    alone = engine.generate([prompt] * 3, seeded)
    assert [c["text"] for c in got] == [o.text for o in alone]
    assert len({c["text"] for c in got}) == 3
    assert worker.writer.served_work == int(record["prompt_tokens"]) + 3 * 8  # prompt + n x max
    assert not worker.held and not worker.engine.has_unfinished()
    worker.engine.block_manager.assert_all_free()
    worker._shutdown()


def test_the_choices_share_the_prompts_kv_blocks(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path, block_size=16)
    job_id = submit(redis_client, tiny_path, prompt=PROMPT, max_tokens=4, seed=1, n=4,
                    ignore_eos=True)  # fmt: skip
    record = run(worker, redis_client, job_id)
    assert record["status"] == "completed", record
    prompt_len = int(record["prompt_tokens"])
    full_blocks = (prompt_len - 1) // 16
    assert full_blocks == 3
    stats = worker.engine.stats()
    # Choices 1..3 each found the prompt's 3 full blocks cached: 3 x 3 x 16 tokens, and
    # the engine computed the prompt once plus each choice's last partial block.
    assert stats["prefix_cache_hits"] == 3 * full_blocks * 16
    assert stats["prompt_tokens"] == prompt_len + 3 * (prompt_len - full_blocks * 16)
    worker._shutdown()


def test_a_prompt_shorter_than_a_block_adds_every_choice_at_once(
    redis_server, redis_client, tiny_path
):
    worker = service(redis_server.url, tiny_path, block_size=16)
    job_id = submit(redis_client, tiny_path, prompt="hi", max_tokens=4, n=3, ignore_eos=True)
    worker._fill()
    assert sorted(worker.engine.requests) == [f"{job_id}#{i}" for i in range(3)]
    assert run(worker, redis_client, job_id)["status"] == "completed"
    worker._shutdown()


def test_cancel_aborts_every_choice(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, prompt=PROMPT, max_tokens=500, n=3, ignore_eos=True)
    for _ in range(10):
        worker._iterate()
    assert len(worker.engine.requests) == 3  # all running
    assert JobStore(redis_client).cancel(job_id, "t") == "cancelling"
    worker._next_refresh = 0.0  # the next lease refresh sees the cancel
    record = run(worker, redis_client, job_id)
    assert record["status"] == "cancelled"
    assert not worker.held and not worker.engine.has_unfinished()
    worker.engine.block_manager.assert_all_free()
    worker._shutdown()


def test_a_cancel_before_the_other_choices_start_ends_them_too(
    redis_server, redis_client, tiny_path
):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, prompt=PROMPT, max_tokens=500, n=3, ignore_eos=True)
    worker._fill()
    assert list(worker.engine.requests) == [f"{job_id}#0"]  # 1 and 2 wait for its blocks
    assert worker.choices.num_waiting == 2
    JobStore(redis_client).cancel(job_id, "t")
    worker._next_refresh = 0.0
    assert run(worker, redis_client, job_id)["status"] == "cancelled"
    assert not worker.held and worker.choices.num_waiting == 0
    assert not worker.engine.has_unfinished()
    worker._shutdown()


def test_one_failed_choice_fails_the_job_naming_it_and_stops_the_others(
    redis_server, redis_client, tiny_path
):
    worker = service(redis_server.url, tiny_path)
    engine = worker.engine
    real_step = engine.step

    def step_failing_choice_2() -> list[RequestOutput]:
        outputs = real_step()
        for i, out in enumerate(outputs):
            if out.request_id.endswith("#2") and not out.finished:
                engine.abort(out.request_id)
                outputs[i] = RequestOutput(out.request_id, [], "", finished=True,
                                           finish_reason="error", error="boom")  # fmt: skip
        return outputs

    engine.step = step_failing_choice_2  # type: ignore[method-assign]
    job_id = submit(redis_client, tiny_path, max_tokens=300, n=3, ignore_eos=True)
    record = run(worker, redis_client, job_id)
    assert record["status"] == "failed"
    assert record["error"] == "choice 2: boom"
    got = choices(record)
    assert [c["finish_reason"] for c in got] == ["abort", "abort", "error"]
    assert int(record["completion_tokens"]) < 20  # the others were stopped, not run out
    assert not worker.held and not engine.has_unfinished()
    worker._shutdown()


def test_a_lost_lease_drops_every_choice_and_writes_nothing(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, prompt=PROMPT, max_tokens=500, n=3, ignore_eos=True)
    for _ in range(10):
        worker._iterate()
    assert len(worker.engine.requests) == 3
    redis_client.hset(Keys.job(job_id), "lease_token", "another-worker")  # reaped, retaken
    worker._next_refresh = 0.0
    worker._iterate()
    worker._iterate()
    assert job_id not in worker.held and not worker.engine.has_unfinished()
    worker.engine.block_manager.assert_all_free()
    record = JobStore(redis_client).get(job_id)
    assert record is not None and record["status"] == "in_progress" and "choices" not in record
    assert redis_client.hlen("unacked") == 0
    worker._shutdown()


def test_a_redis_error_while_saving_an_n_choice_result_loses_nothing(
    redis_server, redis_client, tiny_path
):
    worker = service(redis_server.url, tiny_path)
    real_pipeline, failures = worker.redis.pipeline, []

    def flaky_pipeline(*args, **kwargs):  # type: ignore[no-untyped-def]
        pipe = real_pipeline(*args, **kwargs)
        real_execute = pipe.execute

        def execute(*a, **k):  # type: ignore[no-untyped-def]
            finishing = any(worker.store._finish.sha in str(c[0]) for c in pipe.command_stack)
            if finishing and not failures:
                failures.append(1)
                raise redis.ConnectionError("Redis went away")
            return real_execute(*a, **k)

        pipe.execute = execute
        return pipe

    worker.redis.pipeline = flaky_pipeline  # type: ignore[method-assign]
    job_id = submit(redis_client, tiny_path, max_tokens=6, n=3, ignore_eos=True)
    with pytest.raises(redis.ConnectionError):
        run(worker, redis_client, job_id)
    assert failures and job_id in worker.held  # still held: its lease keeps being refreshed
    worker._come_back()  # Redis is back: the unsaved result is written
    record = JobStore(redis_client).get(job_id)
    assert record is not None and record["status"] == "completed", record
    assert record["completion_tokens"] == "18" and len(choices(record)) == 3
    assert not worker.held and redis_client.hlen("unacked") == 0
    worker._shutdown()


def test_a_bad_n_rejects_the_job(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, n=0)
    record = run(worker, redis_client, job_id)
    assert record["status"] == "failed"
    assert record["error"] == "rejected by the worker: n must be an integer of at least 1, got 0"
    assert not worker.held and not worker.engine.has_unfinished()
    worker._shutdown()


def test_choice_seeds_and_n():
    params = SamplingParams(seed=5)
    assert choice_params(params, 0) is params
    assert choice_params(params, 3).seed == 8
    assert choice_params(SamplingParams(seed=SEED_RANGE - 1), 2).seed == 1  # wraps, stays valid
    assert choice_params(SamplingParams(), 4).seed is None
    sampling = {"max_tokens": 3, "n": 4}
    assert pop_n(sampling) == 4 and sampling == {"max_tokens": 3}
    assert pop_n({}) == 1  # records written before n existed
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(ValueError, match="n must be"):
            pop_n({"n": bad})
