"""Two models, one `tide up` fleet, through the official `openai` client (bounded, loopback).

stories260K (served as "stories", float32: its greedy output is llama2.c's reference) and a
random `dummy:tiny` folder (served as "tiny"), each pool from zero workers: traffic to one
model starts only its worker; a kill -9 of one model's worker mid-run loses nothing and
leaves the other model's jobs alone; both pools drain back to zero. The cold-start figures
(first job to first token from zero, per model) are printed as one JSON line
(`pytest -s tests/service/test_two_models_live.py`) for the closing note and docs."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from tests.conftest import make_engine, wait_for
from tests.service.live_up import LiveUp, tide_up, wait_ended
from tests.service.procs import descendants
from tide_fleet.infra.wire.heartbeats import read_heartbeats
from tide_fleet.worker.engine import SamplingParams

pytestmark = pytest.mark.slow

POOL = """buckets = ["short", "medium", "long"]
min_workers = 0
max_workers = 1
idle_s = 2
target_wait_s = 2
cold_start_s = 2
tokens_per_s = 200
"""
JOBS_PER_MODEL = 10
# Long stories jobs: the kill must land while one runs, and 48 tokens of stories260K end
# within milliseconds of being seen in progress.
MAX_TOKENS = {"stories": 400, "tiny": 48}
fleet_names = {"s260k": "stories", "stories": "stories", "tiny": "tiny"}
PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a boy", "Tom said"]


def fleet_toml(stories: Path, tiny: Path) -> str:
    return (
        "[controller]\npoll_interval_s = 0.3\nscale_in_cooldown_s = 1\n\n"
        f'[pools.s]\nmodel = "{stories}"\nserved_name = "stories"\naliases = ["s260k"]\n{POOL}\n'
        f'[pools.t]\nmodel = "{tiny}"\nserved_name = "tiny"\n{POOL}'
    )


def workers_of(up: LiveUp, pool: str) -> list[int]:
    return [
        p for p, cmd in descendants(up.proc.pid).items()
        if "tide_fleet.infra.cli worker" in cmd and f"--pool {pool} " in f"{cmd} "
    ]  # fmt: skip


def first_token_from_zero(
    client: OpenAI, model: str, prompt: str, max_tokens: int
) -> tuple[float, str]:
    """Seconds from the request to its first streamed token, and the whole text."""
    t0 = time.monotonic()
    first, text = None, ""
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.monotonic()
            text += chunk.choices[0].text
    assert first is not None, f"{model}: no token"
    return first - t0, text


def test_two_models_scale_from_zero_apart_and_survive_a_kill(
    tmp_path, stories_path, stories_refs, tiny_path
):
    (tmp_path / "fleet.toml").write_text(fleet_toml(stories_path, tiny_path))
    flags = ["--fleet", str(tmp_path / "fleet.toml"), "--dtype", "float32", "--max-num-seqs", "8"]
    figures: dict[str, float] = {}
    with tide_up(tmp_path, *flags) as up:
        client = OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0, timeout=120)
        assert {m.id for m in client.models.list().data} == {"stories", "tiny"}
        with pytest.raises(openai.NotFoundError) as err:
            client.completions.create(model="gpt-4o", prompt="hi", max_tokens=2)
        assert err.value.code == "model_not_found" and err.value.body["param"] == "model"  # type: ignore[index]
        assert not workers_of(up, "s") and not workers_of(up, "t"), "both pools start at zero"

        # Model "stories" from zero: only its pool starts; the answer is llama2.c's. Each
        # worker measured its own start (process start to serving), within that wait.
        r = up.redis()

        def from_zero(model: str, prompt: str, max_tokens: int) -> str:
            wait, text = first_token_from_zero(client, model, prompt, max_tokens)
            served = fleet_names[model]
            (start,) = [b.cold_start_s for b in read_heartbeats(r).values() if b.model == served]
            assert start is not None and 0 < start < wait, (start, wait)
            figures[f"{served}_first_token_from_zero_s"] = wait
            figures[f"{served}_worker_start_s"] = start
            return text

        ref = stories_refs[0]
        assert from_zero("s260k", ref["prompt"], ref["max_new_tokens"]) == ref["continuation"]
        assert not workers_of(up, "t"), "traffic to stories started a tiny worker"
        from_zero("tiny", "hi", 8)

        # Both models busy; kill -9 the stories worker mid-run.
        api = httpx.Client(base_url=up.url, timeout=30)
        jobs: dict[str, tuple[str, str]] = {}
        for i in range(JOBS_PER_MODEL):
            for model in ("stories", "tiny"):
                body = {"model": model, "prompt": PROMPTS[i % len(PROMPTS)], "temperature": 0,
                        "max_tokens": MAX_TOKENS[model], "ignore_eos": True}  # fmt: skip
                r = api.post("/v1/jobs", json=body)
                assert r.status_code == 202, r.text
                jobs[r.json()["id"]] = (model, body["prompt"])  # type: ignore[assignment]

        def running(model: str) -> bool:
            return any(
                api.get(f"/v1/jobs/{j}").json()["status"] == "in_progress"
                for j, (m, _) in jobs.items() if m == model
            )  # fmt: skip

        wait_for(lambda: running("stories") and workers_of(up, "s"), 60, what="stories running")
        os.kill(workers_of(up, "s")[0], signal.SIGKILL)

        done = wait_ended(api, jobs, 180)
        assert {j: g["status"] for j, g in done.items() if g["status"] != "completed"} == {}
        engines = {"stories": make_engine(stories_path), "tiny": make_engine(tiny_path)}
        for j, (model, prompt) in jobs.items():
            engine = engines[model]
            params = SamplingParams(max_tokens=MAX_TOKENS[model], temperature=0, ignore_eos=True)
            want = engine.generate([engine.tokenizer.encode(prompt)], params)[0]
            assert done[j]["result"]["text"] == want.text, (model, prompt)
        attempts = {m: max(done[j]["attempts"] for j, (mm, _) in jobs.items() if mm == m)
                    for m in ("stories", "tiny")}  # fmt: skip
        assert attempts["stories"] >= 2 and attempts["tiny"] == 1, attempts  # tiny undisturbed

        # Back to zero, each pool on its own.
        t0 = time.monotonic()
        wait_for(lambda: not workers_of(up, "s") and not workers_of(up, "t"), 90, what="zero")
        figures["drain_to_zero_s"] = round(time.monotonic() - t0, 2)
        print(json.dumps({k: round(v, 2) for k, v in figures.items()}))
