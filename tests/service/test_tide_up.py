"""`tide up` (what `make up` runs): the whole local fleet from one command, and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from openai import OpenAI

from tests.conftest import ROOT
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import free_port

pytestmark = pytest.mark.slow


def test_tide_up_serves_jobs_and_batches_then_stops_cleanly(tmp_path, tiny_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIDE_DATA_DIR": str(tmp_path / "data"),
           "TIDE_BATCH_POLL_INTERVAL": "0.3"}  # fmt: skip
    env.pop("REDIS_URL", None)
    argv = [
        sys.executable,
        "-m",
        "tide_fleet.infra.cli",
        "up",
        "--workers",
        "1",
        "--port",
        str(port),
    ]
    up = subprocess.Popen([*argv, "--model", str(tiny_path)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    out = b""
    try:
        wait_ready(url, timeout=120)
        deadline = time.monotonic()
        job = httpx.post(f"{url}/v1/jobs", json={"prompt": "hi", "max_tokens": 5}).json()
        while (got := httpx.get(f"{url}/v1/jobs/{job['id']}").json())["status"] in (
            "queued",
            "in_progress",
        ):
            time.sleep(0.05)
        assert got["status"] == "completed" and got["usage"]["completion_tokens"] == 5
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
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
    except BaseException:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=120)
        print(out.decode()[-4000:])  # shown by pytest on failure
        raise
    up.send_signal(signal.SIGINT)
    out, _ = up.communicate(timeout=120)
    assert up.returncode == 0, out.decode()[-2000:]
    assert b"Tide is up" in out
