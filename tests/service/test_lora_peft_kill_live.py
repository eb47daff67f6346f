"""LoRA adapters on a live `tide up` fleet against peft, and a worker killed mid-run
(bounded, loopback only), through the official `openai` client.

stories260K (float32) serves three PEFT adapters declared with `--lora`, on two workers of
two adapter slots each (more adapters than slots: loads and evictions). Requests for the
three adapters and the base at once each answer peft's greedy text for their adapter, on
transformers, computed here. Then a worker is killed with -9 while it runs adapter jobs:
every job completes, once (one `done` event each), still equal to peft's, its adapter
kept when it resumes elsewhere."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from openai import OpenAI

from tests.conftest import wait_for
from tests.lora_fixtures import ATTENTION, MLP, make_adapter
from tests.service.live_up import done_statuses, tide_up, wait_ended
from tide_fleet.infra.wire.backlog import adapter_backlog
from tide_fleet.infra.wire.heartbeats import read_heartbeats
from tide_fleet.infra.wire.protocol import Keys

pytestmark = pytest.mark.slow

ADAPTERS = {  # name: (rank, targets, seed)
    "qv-r8": (8, ("q_proj", "v_proj"), 11),
    "mlp-r4": (4, ("gate_proj", "up_proj", "down_proj"), 12),
    "all-r16": (16, (*ATTENTION, *MLP), 13),
}
BASE = "stories"  # the base model's key below; the fleet serves it under its folder's path
MODELS = [BASE, *ADAPTERS]
PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to"]
MAX_TOKENS = 40
KILL_JOBS_PER_MODEL = 6


@pytest.fixture(scope="module")
def folders(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("live-adapters")
    return {
        name: make_adapter(root / name, stories_path, r, targets, seed)
        for name, (r, targets, seed) in ADAPTERS.items()
    }


def peft_ids(stories: Path, folders: dict[str, Path]) -> dict[tuple[str, str], list[int]]:
    """(model, prompt) -> peft's greedy ids on transformers (float32), up to MAX_TOKENS."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(stories))
    out = {}
    for model in MODELS:
        net = AutoModelForCausalLM.from_pretrained(str(stories), dtype=torch.float32)
        if model in folders:
            net = PeftModel.from_pretrained(net, str(folders[model]))
        net.eval()
        for prompt in PROMPTS:
            ids = torch.tensor([tok(prompt)["input_ids"]])
            new: list[int] = []
            with torch.no_grad():
                for _ in range(MAX_TOKENS):
                    nxt = int(net(ids).logits[0, -1].argmax())
                    new.append(nxt)
                    if nxt == tok.eos_token_id:
                        break
                    ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            out[(model, prompt)] = new
    return out


def continuation(stories: Path, prompt: str, ids: list[int]) -> str:
    """The text `ids` add after `prompt`, as Hugging Face's tokenizer decodes it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(stories))
    head = tok(prompt)["input_ids"]
    whole = tok.decode(head + ids, skip_special_tokens=True)
    return whole[len(tok.decode(head, skip_special_tokens=True)) :]


def test_three_adapters_and_the_base_match_peft_and_survive_a_kill(tmp_path, stories_path, folders):
    refs = peft_ids(stories_path, folders)
    texts = {key: continuation(stories_path, key[1], ids) for key, ids in refs.items()}
    for name in ADAPTERS:
        assert any(refs[(name, p)] != refs[(BASE, p)] for p in PROMPTS), name
    flags = ["--model", str(stories_path),
             *(f"--lora={name}={folder}" for name, folder in folders.items()),
             "--workers", "2", "--dtype", "float32", "--max-num-seqs", "8",
             "--max-loras", "2", "--max-lora-rank", "16"]  # fmt: skip
    with tide_up(tmp_path, *flags) as up:
        r = up.redis()
        wait_for(lambda: len(read_heartbeats(r)) == 2, 120, what="two workers")
        client = OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0, timeout=120)
        served = {BASE: str(stories_path)} | {a: a for a in ADAPTERS}  # key -> its `model`
        assert set(served.values()) <= {m.id for m in client.models.list().data}

        # Phase 1: every adapter and the base at once, through the openai client.
        def complete(key: tuple[str, str]) -> str:
            reply = client.completions.create(
                model=served[key[0]], prompt=key[1], max_tokens=MAX_TOKENS, temperature=0
            )
            assert reply.model == served[key[0]]
            return reply.choices[0].text

        keys = [(m, p) for m in MODELS for p in PROMPTS]
        with ThreadPoolExecutor(len(keys)) as pool:
            got = dict(zip(keys, pool.map(complete, keys), strict=True))
        assert {k: v for k, v in got.items() if v != texts[k]} == {}

        # Phase 2: adapter and base jobs queued at once; kill -9 a worker running some.
        api = httpx.Client(base_url=up.url, timeout=30)
        jobs: dict[str, tuple[str, str]] = {}
        for i in range(KILL_JOBS_PER_MODEL):
            for model in MODELS:
                prompt = PROMPTS[i % len(PROMPTS)]
                body = {"model": served[model], "prompt": prompt, "max_tokens": MAX_TOKENS,
                        "temperature": 0}  # fmt: skip
                res = api.post("/v1/jobs", json=body)
                assert res.status_code == 202, res.text
                jobs[res.json()["id"]] = (model, prompt)

        def busy_adapter_worker() -> int | None:
            for beat in read_heartbeats(r).values():
                if beat.held and beat.adapters and beat.pid in up.workers():
                    return beat.pid
            return None

        victim = wait_for(busy_adapter_worker, 60, interval=0.02, what="a busy adapter worker")
        os.kill(victim, signal.SIGKILL)

        done = wait_ended(api, jobs, 240)
        assert {j: g["status"] for j, g in done.items() if g["status"] != "completed"} == {}
        wrong = {j: (key, done[j]["result"]["text"]) for j, key in jobs.items()
                 if done[j]["result"]["text"] != texts[key]}  # fmt: skip
        assert wrong == {}
        for j, (model, _) in jobs.items():  # completed once; its adapter on the record
            assert done_statuses(r, j) == [b"completed"], j
            lora = (r.hget(Keys.job(j), "lora") or b"").decode()
            assert lora == ("" if model == BASE else model), j
        attempts = [done[j]["attempts"] for j in jobs]
        assert max(attempts) >= 2, "the kill interrupted nothing: the test could not fail"
        assert adapter_backlog(r) == {}
        held = {a for b in read_heartbeats(r).values() for a in b.adapters}
        assert held and held <= set(ADAPTERS), held
        print(json.dumps({"jobs": len(jobs), "resumed": sum(a >= 2 for a in attempts)}))
