"""Tokenising a large prompt does not stall the event loop: /healthz answers meanwhile."""

from __future__ import annotations

import json
import shutil
import threading
import time

import pytest

from tests.gateway.test_api import A, make_client
from tide_fleet.infra.jobs.submission import ModelInfo

pytestmark = pytest.mark.timeout(60)  # a request that waits for a worker fails, not hangs

PROMPT_CHARS = 1_500_000  # about 1.5 MB of JSON, under the default body limit


@pytest.fixture
def long_context_model(tiny_path, tmp_path):
    """dummy:tiny with a context of 2M tokens, so a 1.5M-character prompt passes the
    character pre-check and is tokenised (then refused for its tokens: nothing runs)."""
    folder = tmp_path / "long-context"
    shutil.copytree(tiny_path, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 2_000_000
    (folder / "config.json").write_text(json.dumps(config))
    return folder


TEXTS = [
    "Once upon a time",
    "<s>hello</s> <unk>",
    "  spaces\n\ttabs  ",
    "héllo wörld ✓ 日本語",
    "x",
]


@pytest.mark.parametrize("model", ["tiny_path", "stories_path"])
def test_the_gateway_counts_exactly_what_the_tokenizer_encodes(request, model):
    info = ModelInfo.load(str(request.getfixturevalue(model)))
    for text in TEXTS:
        assert info.encode(text) == info.tokenizer.encode(text), text
        plain = info.encode(text, add_special_tokens=False)
        assert plain == info.tokenizer.encode(text, add_special_tokens=False), text


def test_tokeniser_releases_the_gil(tiny_path):
    """The count runs in a thread that must not hold the GIL for the whole encode."""
    info = ModelInfo.load(str(tiny_path))
    gaps: list[float] = []
    done = threading.Event()

    def count() -> None:
        info.encode("word " * (PROMPT_CHARS // 5))
        done.set()

    thread = threading.Thread(target=count)
    start = time.perf_counter()
    thread.start()
    while not done.is_set():
        t = time.perf_counter()
        time.sleep(0.005)
        gaps.append(time.perf_counter() - t)
    thread.join()
    assert max(gaps) < 0.25, (max(gaps), time.perf_counter() - start)


def test_healthz_answers_while_a_large_prompt_is_tokenised(
    redis_server, redis_client, long_context_model
):
    prompt = "word " * (PROMPT_CHARS // 5)
    with make_client(redis_server, str(long_context_model), max_body_bytes=4 * 2**20) as c:
        result: dict = {}

        def submit() -> None:
            t = time.perf_counter()
            result["r"] = c.post("/v1/jobs", json={"prompt": prompt, "max_tokens": 1}, headers=A)
            result["seconds"] = time.perf_counter() - t

        thread = threading.Thread(target=submit)
        thread.start()
        latencies = []
        while thread.is_alive():
            t = time.perf_counter()
            assert c.get("/healthz").status_code == 200
            latencies.append(time.perf_counter() - t)
            time.sleep(0.02)
        thread.join()
    assert result["r"].status_code == 202, result["r"].text[:300]
    assert len(latencies) >= 3, (latencies, result["seconds"])  # it overlapped the submit
    assert max(latencies) < 0.5, (max(latencies), result["seconds"])
