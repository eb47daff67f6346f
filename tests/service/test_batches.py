"""The Files and Batches API with the official openai client against a live fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from openai import OpenAI

from tests.conftest import ROOT, make_engine
from tide_fleet.worker.engine import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["Once upon a time", "Lily wanted to", "The little dog", "One day, a cat"]


@pytest.fixture
def client(fleet):
    return OpenAI(base_url=f"{fleet.url}/v1", api_key="key-a", max_retries=0)


def line(custom_id: str, body: dict, url: str = "/v1/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def wait_batch(client: OpenAI, batch_id: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def test_batch_end_to_end_with_the_openai_client(client, fleet_model):
    requests = [
        {"prompt": PROMPTS[i % 4], "max_tokens": 5 + 7 * (i % 5), "temperature": 0}
        for i in range(30)
    ]
    lines = [line(f"req-{i}", body) for i, body in enumerate(requests)]
    lines.insert(7, line("bad-max", {"prompt": "x", "max_tokens": 0}))
    lines.insert(12, line("too-long", {"prompt": "word " * 2000, "max_tokens": 5}))
    upload = client.files.create(file=("input.jsonl", "\n".join(lines).encode()), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes > 0
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h",
        metadata={"project": "tests"},
    )  # fmt: skip
    assert batch.status == "validating" and batch.metadata == {"project": "tests"}
    done = wait_batch(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 32
    assert done.request_counts.completed == 30 and done.request_counts.failed == 2
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(30)]  # input order
    assert [e["custom_id"] for e in errors] == ["bad-max", "too-long"]
    assert "max_tokens" in errors[0]["error"]["message"]
    assert "context" in errors[1]["error"]["message"]
    engine = make_engine(fleet_model)
    expected = engine.generate(
        [engine.tokenizer.encode(r["prompt"]) for r in requests],
        [SamplingParams(max_tokens=r["max_tokens"], temperature=0.0) for r in requests],
    )
    for out, want in zip(output, expected, strict=True):
        body = out["response"]["body"]
        assert out["response"]["status_code"] == 200 and out["error"] is None
        assert body["object"] == "text_completion"
        assert body["choices"][0]["text"] == want.text
        assert body["usage"]["completion_tokens"] == len(want.token_ids)
    listed = client.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]


def test_malformed_files_fail_with_the_line_named(client):
    ok = line("a", {"prompt": "x"})
    cases = {
        "not-jsonl": (ok + "\nthis is not json\n", "line 2: not a JSON object"),
        "duplicate": (ok + "\n" + ok, "line 2: custom_id 'a' is used twice"),
        "wrong-url": (
            line("a", {"prompt": "x"}, url="/v1/embeddings"),
            "line 1: url '/v1/embeddings' is not the batch's endpoint",
        ),
    }
    for name, (content, message) in cases.items():
        f = client.files.create(file=(f"{name}.jsonl", content.encode()), purpose="batch")
        batch = client.batches.create(
            input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
        )
        done = wait_batch(client, batch.id)
        assert done.status == "failed", name
        assert any(message in e.message for e in done.errors.data), (name, done.errors)


def test_cancel_mid_batch_keeps_partial_results(client, fleet_redis):
    body = {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    # Enough lines that the cancel lands mid-batch on a fast CPU too: 40 lines finished in
    # the time the loop below took to see two completed and cancel (1 run in 3 on a Zen 5).
    lines = 160
    content = "\n".join(line(f"c-{i}", body) for i in range(lines)).encode()
    f = client.files.create(file=("cancel.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while (
        client.batches.retrieve(batch.id).request_counts.completed < 2
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    client.batches.cancel(batch.id)
    done = wait_batch(client, batch.id)
    assert done.status == "cancelled"
    assert 2 <= done.request_counts.completed < lines
    output = client.files.content(done.output_file_id).text.splitlines()
    errors = client.files.content(done.error_file_id).text.splitlines()
    assert len(output) == done.request_counts.completed and len(output) + len(errors) == lines
    assert {json.loads(e)["error"]["code"] for e in errors} == {"job_cancelled"}


def test_expiry_cancels_what_has_not_started(client):
    body = {"prompt": "Lily wanted to", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    content = "\n".join(line(f"e-{i}", body) for i in range(80)).encode()
    f = client.files.create(file=("expire.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/completions", completion_window="1s"
    )
    done = wait_batch(client, batch.id)
    assert done.status == "expired" and done.expired_at is not None
    assert done.request_counts.completed < 80
    assert done.request_counts.completed + done.request_counts.failed == 80


def test_files_api_limits_and_isolation(client, fleet):
    other = OpenAI(base_url=f"{fleet.url}/v1", api_key="key-b", max_retries=0)
    f = client.files.create(file=("x.jsonl", line("a", {"prompt": "x"}).encode()), purpose="batch")
    assert client.files.retrieve(f.id).filename == "x.jsonl"
    assert f.id in [x.id for x in client.files.list().data]
    with pytest.raises(Exception, match=r"404|not found"):
        other.files.retrieve(f.id)
    assert client.files.delete(f.id).deleted
    with pytest.raises(Exception, match=r"404|not found"):
        client.files.retrieve(f.id)


def test_worker_kill_9_mid_batch_loses_and_duplicates_nothing(client, fleet, fleet_redis):
    from tests.service.test_fleet import _held_by, _wait_worker

    victim = fleet.spawn_worker("batch-victim")
    _wait_worker(fleet_redis, victim.pid)
    body = {"prompt": "The little dog", "max_tokens": 300, "temperature": 0, "ignore_eos": True}
    content = "\n".join(line(f"k-{i}", body) for i in range(24)).encode()
    f = client.files.create(file=("kill.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while not _held_by(fleet_redis, victim.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _held_by(fleet_redis, victim.pid), "the victim never took a job"
    victim.kill()
    victim.wait()
    done = wait_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 24
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in output] == [f"k-{i}" for i in range(24)]
    assert all(o["response"]["body"]["usage"]["completion_tokens"] == 300 for o in output)


def test_tide_batch_run_through_the_fleet_equals_offline(fleet, fleet_model, tmp_path):
    requests = [
        {"prompt": PROMPTS[i % 4], "max_tokens": 6 + i, "temperature": 0} for i in range(12)
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(line(f"t-{i}", r) for i, r in enumerate(requests)) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tide = [sys.executable, "-m", "tide_fleet.infra.cli", "batch", "run", str(src)]
    via_fleet = ["-o", str(tmp_path / "fleet.jsonl"), "--url", fleet.url, "--api-key", "key-a"]
    offline = ["-o", str(tmp_path / "offline.jsonl"), "--offline", "--model", str(fleet_model),
               "--dtype", "float32"]  # fmt: skip
    for extra in (via_fleet, offline):
        subprocess.run([*tide, *extra], cwd=ROOT, env=env, check=True, timeout=300)

    def texts(name: str) -> list[tuple[str, str]]:
        rows = [json.loads(x) for x in (tmp_path / name).read_text().splitlines()]
        return [(r["custom_id"], r["response"]["body"]["choices"][0]["text"]) for r in rows]

    assert texts("fleet.jsonl") == texts("offline.jsonl")
    assert [c for c, _ in texts("fleet.jsonl")] == [f"t-{i}" for i in range(12)]


def test_batch_completion_webhook_is_signed(fleet):
    import httpx
    from standardwebhooks import Webhook

    from tests.service.conftest import SECRET, Receiver, wait_for

    receiver = Receiver()
    try:
        with httpx.Client(base_url=fleet.url, headers={"Authorization": "Bearer key-a"}) as api:
            content = line("w", {"prompt": "Once upon a time", "max_tokens": 4}).encode()
            f = api.post(
                "/v1/files", files={"file": ("w.jsonl", content)}, data={"purpose": "batch"}
            ).json()
            body = {
                "input_file_id": f["id"],
                "endpoint": "/v1/completions",
                "webhook": {"url": receiver.url},
            }
            batch = api.post("/v1/batches", json=body).json()
        wait_for(lambda: receiver.calls, timeout=60)
        headers, payload = receiver.calls[0]
        event = Webhook(SECRET).verify(payload, headers)
        assert event["id"] == batch["id"] and event["status"] == "completed"
        assert headers["webhook-id"] == f"msg_{batch['id']}_completed"
    finally:
        receiver.close()


def test_celery_and_gateway_restarts_mid_batch_lose_and_duplicate_nothing(client, fleet):
    import httpx

    body = {"prompt": "Lily wanted to", "max_tokens": 20, "temperature": 0}
    content = "\n".join(line(f"r-{i}", body) for i in range(300)).encode()
    f = client.files.create(file=("restart.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
    )
    time.sleep(0.3)  # the validate task is running or queued: kill the Celery worker now
    fleet.kill_and_restart("webhooks")
    fleet.kill_and_restart("gateway")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{fleet.url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    done = wait_batch(client, batch.id, timeout=180)
    assert done.status == "completed" and done.request_counts.completed == 300
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in output] == [f"r-{i}" for i in range(300)]
    assert len({o["response"]["request_id"] for o in output}) == 300  # one job per line
