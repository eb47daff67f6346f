"""The output and error files: input order, one line per request, the right file for each."""

from __future__ import annotations

import json

from tests.infra.batches.conftest import line
from tide_fleet.infra.batches import finalize
from tide_fleet.infra.batches.finalize import finalize_batch, output_lines
from tide_fleet.infra.batches.store import FANOUT_CHUNK
from tide_fleet.infra.batches.validate import validate_batch
from tide_fleet.infra.wire.protocol import JobStatus, Keys

OK = {"prompt": "Once upon a time", "max_tokens": 4}


def _content(world, file_id: str) -> list[dict]:
    record = world.h.files.get(file_id)
    with world.h.files.storage.open(record["storage_key"]) as f:
        return [json.loads(x) for x in f.read().splitlines()]


def _finalizing(world, batch_id: str, **fields) -> None:
    assert world.h.batches.transition(batch_id, ["in_progress"], status="finalizing", **fields)


def test_finalize_writes_output_and_error_files_in_input_order(world, monkeypatch):
    sent = []
    monkeypatch.setattr(finalize, "enqueue_webhook", lambda *a, **k: sent.append((a, k)))
    text = "\n".join(
        [line("a", OK), line("b", {"prompt": "x", "top_k": 0}), line("c", OK), line("d", OK)]
    )
    batch_id = world.new_batch(text, webhook_url="https://example.com/hook")
    validate_batch(batch_id)
    a, c, d = world.job_ids(batch_id)
    world.finish(a)
    world.finish(c, JobStatus.FAILED)
    world.finish(d)
    _finalizing(world, batch_id, failed=2)
    assert finalize_batch(batch_id) == "completed"
    batch = world.h.batches.get(batch_id)
    assert batch["status"] == "completed" and batch["completed_at"]
    out = _content(world, batch["output_file_id"])
    assert [(o["id"], o["custom_id"]) for o in out] == [
        (f"batch_req_{batch_id}_0", "a"), (f"batch_req_{batch_id}_3", "d"),
    ]  # fmt: skip
    assert out[0]["response"]["status_code"] == 200 and out[0]["error"] is None
    assert out[0]["response"]["request_id"] == a
    assert out[0]["response"]["body"]["choices"][0]["text"] == f"out-{a}"
    assert out[0]["response"]["body"]["model"] == world.h.settings.model
    errors = _content(world, batch["error_file_id"])
    assert [e["custom_id"] for e in errors] == ["b", "c"]
    assert errors[0]["response"]["status_code"] == 400
    assert errors[0]["error"]["code"] == "invalid_request"
    assert errors[1] == {
        "id": f"batch_req_{batch_id}_2", "custom_id": "c", "response": None,
        "error": {"code": "job_failed", "message": "it broke"},
    }  # fmt: skip
    assert not world.h.client.sismember(Keys.active_batches, batch_id)
    assert sent == [((batch_id, "completed"), {"kind": "batch"})]
    assert finalize_batch(batch_id) == "skipped"  # a second run changes nothing
    assert sent == [((batch_id, "completed"), {"kind": "batch"})]


def test_a_stopped_batch_ends_in_its_final_status(world):
    batch_id = world.new_batch("\n".join(line(f"r{i}", OK) for i in range(2)))
    validate_batch(batch_id)
    first, second = world.job_ids(batch_id)
    world.finish(first)
    world.h.jobs.cancel(second, "t")
    _finalizing(world, batch_id, final_status="expired", failed=1)
    assert finalize_batch(batch_id) == "expired"
    batch = world.h.batches.get(batch_id)
    assert batch["status"] == "expired" and batch["expired_at"] and batch["completed_at"] == ""
    errors = _content(world, batch["error_file_id"])
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("r1", "job_cancelled")]


def test_no_error_file_when_nothing_failed(world):
    batch_id = world.new_batch(line("a", OK))
    validate_batch(batch_id)
    world.finish(*world.job_ids(batch_id))
    _finalizing(world, batch_id)
    assert finalize_batch(batch_id) == "completed"
    assert not world.h.batches.get(batch_id).get("error_file_id")


def test_output_lines_stream_in_chunks_and_mark_lost_lines(world):
    total = FANOUT_CHUNK + 3
    world.h.batches.create({"id": "b", "tenant": "t", "created_at": 1.0, "total": total,
                            "endpoint": "/v1/chat/completions"})  # fmt: skip
    batch = world.h.batches.get("b")
    chunks = list(output_lines(batch, world.h.batches, "m", want_errors=True))
    assert len(chunks) == 2  # no line table: every line lost, each one an error
    rows = [json.loads(x) for chunk in chunks for x in chunk.splitlines()]
    assert len(rows) == total and rows[-1]["id"] == f"batch_req_b_{total - 1}"
    assert rows[0]["response"]["status_code"] == 500 and rows[0]["error"]["message"] == "line lost"
    assert list(output_lines(batch, world.h.batches, "m", want_errors=False)) == []


def test_a_line_whose_job_expired_is_a_batch_expired_error_line(world):
    batch_id = world.new_batch("\n".join(line(f"r{i}", OK) for i in range(2)))
    validate_batch(batch_id)
    first, second = world.job_ids(batch_id)
    batch = world.h.batches.get(batch_id)
    record = world.h.jobs.get(second)
    assert float(record["deadline"]) == float(batch["expires_at"])  # the window's end
    world.finish(first)
    assert world.h.jobs.expire_due(now=float(batch["expires_at"]) + 1) == [second]
    _finalizing(world, batch_id, failed=1)
    assert finalize_batch(batch_id) == "completed"
    [error] = _content(world, world.h.batches.get(batch_id)["error_file_id"])
    assert error["custom_id"] == "r1" and error["response"] is None
    assert error["error"]["code"] == "batch_expired"
