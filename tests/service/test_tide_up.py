"""`tide up` (what `make up` runs): the whole local fleet from one command, and Ctrl-C."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from openai import OpenAI

from tests.service.live_up import tide_up

pytestmark = pytest.mark.slow


def test_tide_up_serves_jobs_and_batches_then_stops_cleanly(tmp_path, tiny_path):
    flags = ("--workers", "1", "--model", str(tiny_path))
    with tide_up(tmp_path, *flags, env={"TIDE_BATCH_POLL_INTERVAL": "0.3"}) as up:
        deadline = time.monotonic()
        job = httpx.post(f"{up.url}/v1/jobs", json={"prompt": "hi", "max_tokens": 5}).json()
        while (got := httpx.get(f"{up.url}/v1/jobs/{job['id']}").json())["status"] in (
            "queued",
            "in_progress",
        ):
            time.sleep(0.05)
        assert got["status"] == "completed" and got["usage"]["completion_tokens"] == 5
        client = OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0)
        line = {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "x", "max_tokens": 3},
        }
        f = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
        batch = client.batches.create(
            input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
        )
        while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed"):
            assert time.monotonic() < deadline + 180, batch
            time.sleep(0.1)
        assert batch.status == "completed" and batch.request_counts.completed == 1
        assert "Tide is up" in up.stop()
