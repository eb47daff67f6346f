"""Shared fixtures: model folders (stories260K from ../shared, dummy models in a temp cache)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tide_fleet.infra.fleet.redis_server import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]

# Triton kernels run in Triton's interpreter on machines without a GPU; the variable must
# be set before the kernels module is imported (its decorators read it).
if not Path("/dev/nvidia0").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _find_stories() -> Path:
    """The shared fixture model: $TIDE_STORIES_PATH, ../shared beside the checkout, /work/shared."""
    if os.environ.get("TIDE_STORIES_PATH"):  # explicit: use it (or skip), no fallback
        return Path(os.environ["TIDE_STORIES_PATH"])
    for c in (ROOT.parent / "shared/models/stories260K", Path("/work/shared/models/stories260K")):
        if (c / "model.safetensors").is_file():
            return c
    return ROOT.parent / "shared/models/stories260K"


STORIES = _find_stories()


@pytest.fixture(scope="session", autouse=True)
def _dummy_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["TIDE_CACHE_DIR"] = str(tmp_path_factory.mktemp("tide-cache"))
    from tide_fleet.infra.settings import get_settings

    get_settings.cache_clear()  # read once already while tests were collected


@pytest.fixture(scope="session")
def stories_path() -> Path:
    if not (STORIES / "model.safetensors").is_file():
        pytest.skip(f"stories260K not found at {STORIES}")
    return STORIES


@pytest.fixture(scope="session")
def stories_refs(stories_path: Path) -> list[dict]:
    return json.loads((stories_path / "reference_outputs.json").read_text())["references"]


@pytest.fixture(scope="session")
def tiny_path(_dummy_cache: None) -> Path:
    from tide_fleet.worker.models.resolve import resolve_model_path

    return resolve_model_path("dummy:tiny")


def make_engine(path: Path | str, dtype: str = "float32", **config):
    from tide_fleet.worker.engine import LLMEngine

    return LLMEngine.from_pretrained(str(path), dtype=dtype, device="cpu", **config)


def record_logits(model) -> list:  # type: ignore[no-untyped-def]
    """Wrap model.forward so every step's logits are kept, in order; returns that list."""
    logits: list = []
    original = model.forward

    def recording_forward(*args):  # type: ignore[no-untyped-def]
        logits.append(original(*args))
        return logits[-1]

    model.forward = recording_forward
    return logits


def assert_same_run(a: tuple, b: tuple, min_steps: int) -> None:
    """Two (tokens, step logits) runs agree bit for bit over more than min_steps steps."""
    import torch

    assert a[0] == b[0]
    assert len(a[1]) == len(b[1]) > min_steps
    for x, y in zip(a[1], b[1], strict=True):
        assert torch.equal(x, y)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(Path(tmp_path_factory.mktemp("redis"))).start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """A moto server (AWS emulator) on loopback, one per test module (each module starts from
    an empty account), with fake credentials in the environment."""
    import shutil
    import subprocess
    import sys
    import time

    import httpx

    from tide_fleet.infra.fleet.redis_server import free_port

    exe = shutil.which("moto_server") or os.path.join(
        os.path.dirname(sys.executable), "moto_server"
    )
    if not os.path.exists(exe):
        pytest.skip("moto_server is not installed")
    port = free_port()
    env = dict(os.environ, MOTO_IAM_LOAD_MANAGED_POLICIES="true")  # AWS-managed IAM policies
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("moto_server did not start")
            time.sleep(0.1)
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    yield url
    proc.terminate()
    proc.wait()


def wait_for(predicate, timeout: float = 60, interval: float = 0.05, what: str = "it"):  # type: ignore[no-untyped-def]
    """Poll predicate until it returns something truthy (returned), or fail after timeout."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
