"""What a worker writes for logprobs and streams: per-choice logprob entries in the wire
shape, deltas that name their choice and carry their tokens' entries, no deltas for batch
jobs, and stop text left out of both the result and the stream."""

from __future__ import annotations

import json

from tests.conftest import make_engine
from tests.worker.service_driver import ASCII_ONLY, choices, events, run, service, submit
from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.logprobs import NOT_FINITE, LogprobEntries

KEYS = {"token", "bytes", "logprob", "top_logprobs"}


def _check_entries(entries: list[dict], top: int) -> None:
    for e in entries:
        assert set(e) == KEYS
        assert e["token"] == bytes(e["bytes"]).decode("utf-8", errors="replace")
        assert e["logprob"] <= 0
        alts = e["top_logprobs"]
        assert len(alts) == top and all(set(a) == KEYS - {"top_logprobs"} for a in alts)
        assert [a["logprob"] for a in alts] == sorted((a["logprob"] for a in alts), reverse=True)


def test_logprobs_per_choice_in_the_wire_shape(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, max_tokens=10, seed=3, n=2, logprobs=2,
                    logit_bias=ASCII_ONLY)  # fmt: skip
    record = run(worker, redis_client, job_id)
    assert record["status"] == "completed", record
    for c in choices(record):
        entries = c["logprobs"]
        assert len(entries) == c["completion_tokens"] == 10
        _check_entries(entries, top=2)
        # ASCII text: the sampled tokens' bytes are exactly its UTF-8.
        assert c["text"].isascii() and c["text"]
        assert b"".join(bytes(e["bytes"]) for e in entries) == c["text"].encode()
        assert "".join(e["token"] for e in entries) == c["text"]
    worker._shutdown()


def test_logprobs_zero_gives_the_sampled_token_alone(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, max_tokens=4, logprobs=0, ignore_eos=True)
    record = run(worker, redis_client, job_id)
    (only,) = choices(record)
    assert len(only["logprobs"]) == 4
    _check_entries(only["logprobs"], top=0)
    worker._shutdown()


def test_stream_deltas_name_their_choice_and_carry_its_entries(
    redis_server, redis_client, tiny_path
):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, max_tokens=12, seed=9, n=3, logprobs=1,
                    ignore_eos=True)  # fmt: skip
    record = run(worker, redis_client, job_id)
    deltas = [e for e in events(redis_client, job_id) if e["type"] == "delta"]
    assert {d["i"] for d in deltas} == {"0", "1", "2"}
    for c in choices(record):
        mine = [d for d in deltas if d["i"] == str(c["index"])]
        assert "".join(d["text"] for d in mine) == c["text"]
        assert sum(int(d["n"]) for d in mine) == c["completion_tokens"]
        streamed = [e for d in mine for e in json.loads(d["lp"])]
        assert all(len(json.loads(d["lp"])) == int(d["n"]) for d in mine)
        assert streamed == c["logprobs"]
    worker._shutdown()


def test_deltas_without_logprobs_carry_no_lp_and_choice_zero(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, max_tokens=5, ignore_eos=True)
    run(worker, redis_client, job_id)
    deltas = [e for e in events(redis_client, job_id) if e["type"] == "delta"]
    assert deltas and all(d["i"] == "0" and "lp" not in d for d in deltas)
    worker._shutdown()


def test_batch_jobs_publish_no_deltas(redis_server, redis_client, tiny_path):
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, priority="batch", max_tokens=5, n=2, logprobs=1,
                    ignore_eos=True)  # fmt: skip
    record = run(worker, redis_client, job_id)
    assert record["status"] == "completed" and len(choices(record)) == 2
    assert [e["type"] for e in events(redis_client, job_id)] == ["done"]
    worker._shutdown()


def test_stop_text_is_left_out_of_the_result_and_the_stream(redis_server, redis_client, tiny_path):
    sampling = dict(max_tokens=40, temperature=0.0, logit_bias=ASCII_ONLY)
    engine = make_engine(tiny_path)
    tok = Tokenizer(tiny_path)
    prompt = tok.encode("once upon a time")
    bias = {int(t): b for t, b in ASCII_ONLY.items()}
    full = engine.generate([prompt], SamplingParams(max_tokens=40, temperature=0.0,
                                                    logit_bias=bias))[0].text  # fmt: skip
    stop = full[12:15]
    assert len(stop) == 3 and full.index(stop) > 0
    worker = service(redis_server.url, tiny_path)
    job_id = submit(redis_client, tiny_path, stop=[stop], n=2, **sampling)
    record = run(worker, redis_client, job_id)
    assert record["finish_reason"] == "stop"
    assert record["text"] == full[: full.index(stop)]
    deltas = [e for e in events(redis_client, job_id) if e["type"] == "delta"]
    for c in choices(record):  # greedy: both choices stop at the same place
        assert c["text"] == record["text"] and c["finish_reason"] == "stop"
        assert "".join(d["text"] for d in deltas if d["i"] == str(c["index"])) == c["text"]
    worker._shutdown()


def test_entries_sort_alternatives_and_keep_json_finite(tiny_path):
    from tide_fleet.worker.engine.request import TokenLogprob

    entries = LogprobEntries(Tokenizer(tiny_path))
    (e,) = entries([TokenLogprob(4 + ord("a"), -0.5, {4 + ord("b"): -2.0, 4 + ord("a"): -0.5})])
    assert e["token"] == "a" and e["bytes"] == [ord("a")] and e["logprob"] == -0.5
    assert [a["token"] for a in e["top_logprobs"]] == ["a", "b"]
    (e,) = entries([TokenLogprob(4, float("-inf"), {})])
    assert e["logprob"] == NOT_FINITE
    json.dumps(e, allow_nan=False)
    assert LogprobEntries(None)([TokenLogprob(7, -1.0, {})])[0]["bytes"] == []
