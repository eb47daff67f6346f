"""The console against a live local fleet in a real headless Chromium (Selenium).

`tide up` runs as one process with a fleet file of two pools: `live` (always one worker,
the short bucket) and `burst` (medium and long, scaled 0 -> 1 -> 0 by the controller). The
browser is Debian's chromium with its chromedriver (`make browser` installs them); without
them every browser test skips, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, STORIES
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import free_port

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b", "key-op": "ops"}
ADMIN_KEYS = ["key-op"]
SHORT_MAX, MEDIUM_MAX = 300, 600  # stories260K's context is 512: medium is reachable

FLEET_TOML = """
[controller]
poll_interval_s = 0.5
scale_in_cooldown_s = 1
actuator = "local"

[pools.live]
buckets = ["short"]
min_workers = 1
max_workers = 1
cold_start_s = 5

[pools.burst]
buckets = ["medium", "long"]
min_workers = 0
max_workers = 1
idle_s = 2
cold_start_s = 5
drain_timeout_s = 20
"""

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and
                 os.path.exists(p)), None)  # fmt: skip
CHROMEDRIVER = next((p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver") if p and
                     os.path.exists(p)), None)  # fmt: skip


class ConsoleFleet:
    def __init__(self, tmp: Path, model: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ConsoleFleet:
        fleet_file = self.tmp / "fleet.toml"
        fleet_file.write_text(FLEET_TOML)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TIDE_API_KEYS": json.dumps(KEYS),
            "TIDE_ADMIN_KEYS": json.dumps(ADMIN_KEYS),
            "TIDE_BUCKET_SHORT_MAX": str(SHORT_MAX),
            "TIDE_BUCKET_MEDIUM_MAX": str(MEDIUM_MAX),
            "TIDE_LEASE_SECONDS": "2",
            "TIDE_REAPER_INTERVAL": "0.3",
            "TIDE_BATCH_POLL_INTERVAL": "0.3",
            "TIDE_WORKER_HEARTBEAT_SECONDS": "1",
            "OMP_NUM_THREADS": "1",
        }
        env.pop("REDIS_URL", None)
        argv = [sys.executable, "-m", "tide_fleet.infra.cli", "up", "--fleet", str(fleet_file),
                "--port", str(self.port), "--model", str(self.model),
                "--data-dir", str(self.tmp / "data"), "--dtype", "float32",
                "--max-num-seqs", "4"]  # fmt: skip
        log = open(self.tmp / "tide-up.log", "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log)
        try:
            wait_ready(self.url, timeout=120)
            self.wait_live_worker()
        except (RuntimeError, TimeoutError):
            self.stop()
            raise
        return self

    def wait_live_worker(self, timeout: float = 120) -> None:
        """The `live` pool's worker beats: the tests start on a serving fleet."""
        deadline = time.monotonic() + timeout
        with self.client("key-op") as api:
            while time.monotonic() < deadline:
                if api.get("/console/api/fleet").json()["totals"]["workers"] >= 1:
                    return
                time.sleep(0.2)
        raise TimeoutError(f"no worker started; logs in {self.tmp}")

    def client(self, key: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"},
                            timeout=30)  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="package")
def browser_tools() -> tuple[str, str]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no chromium/chromedriver installed: `make browser` (apt-get install -y "
                    "chromium chromium-driver) enables the console's browser tests")  # fmt: skip
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture(scope="package")
def console_model(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """stories260K (real text) when ../shared has it, else dummy:tiny; with a chat template."""
    source = STORIES if (STORIES / "model.safetensors").is_file() else tiny_path
    folder = tmp_path_factory.mktemp("console-model") / source.name
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("llama2c"))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if not config.get("chat_template"):
        config_path.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return folder


@pytest.fixture(scope="package")
def console_fleet(browser_tools, console_model, tmp_path_factory) -> Iterator[ConsoleFleet]:
    fleet = ConsoleFleet(tmp_path_factory.mktemp("console-fleet"), console_model)
    try:
        yield fleet.start()
    finally:
        fleet.stop()


@pytest.fixture(scope="package")
def browser(browser_tools) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = browser_tools
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1440,1100",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
