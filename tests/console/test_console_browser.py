"""The web console in a real headless Chromium against a live `tide up` fleet.

Each test signs in with a key, drives the pages as a person would and reads what they show;
screenshots land in the test's tmp folder (TIDE_UPDATE_SCREENSHOTS=1 also refreshes
docs/img/console-fleet.png).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("selenium", reason="selenium (the dev extras) drives the browser tests")

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.conftest import ROOT
from tests.console.driver import Console

pytestmark = pytest.mark.slow

PAGES = {  # page -> what shows it has drawn its data
    "fleet": "tr[data-pool='live']",
    "jobs": "#main table",
    "batches": "#main table",
    "playground": "#pg-send",
}


@pytest.fixture
def console(browser, console_fleet, tmp_path) -> Console:
    c = Console(browser, console_fleet.url, tmp_path / "screenshots")
    c.errors()  # drop what earlier tests left in the log
    return c


def test_every_page_loads_without_console_errors(console):
    console.sign_in("key-op")
    for page, ready in PAGES.items():
        console.go(page)
        console.wait(lambda ready=ready: console.visible(ready), f"{page} drawn")
        time.sleep(1.2)  # at least one more poll of the page's data
        console.screenshot(page)
        assert console.errors() == [], page
        assert "error" not in (console.attr(".status-line", "class") or ""), console.text(
            ".status-line"
        )


def test_docs_and_redoc_render_offline(console, console_fleet):
    d = console.d
    d.get(f"{console_fleet.url}/docs")
    ops = console.wait(lambda: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"), "ops")
    paths = {el.text.replace("\u200b", "") for el in ops}
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/batches"} <= paths
    console.screenshot("docs")
    d.get(f"{console_fleet.url}/redoc")
    console.wait(lambda: "/v1/jobs" in d.find_element(By.TAG_NAME, "body").text, "redoc ops")
    scripts = [s.get_attribute("src") for s in d.find_elements(By.TAG_NAME, "script")]
    styles = [s.get_attribute("href") for s in d.find_elements(By.CSS_SELECTOR, "link")]
    assert all(s.startswith(console_fleet.url) for s in scripts + styles if s), scripts + styles
    # ReDoc's bundle hard-codes one decorative image (its "by Redocly" badge) on its CDN and
    # hides it when it fails to load: the only request that leaves the machine.
    badge = "cdn.redoc.ly/redoc/logo-mini.svg"
    assert [e for e in console.errors() if badge not in e] == []


def test_playground_streams_an_answer(console):
    console.sign_in("key-a")
    console.go("playground")
    d = console.d
    # Record each change of the answer as it happens: tokens arrive in more than one piece.
    d.execute_script("""
        window.__pieces = [];
        new MutationObserver(() => window.__pieces.push(
            document.getElementById('pg-output').textContent.length))
          .observe(document.getElementById('pg-output'), {childList: true, characterData: true,
                                                          subtree: true});
    """)
    box = d.find_element(By.ID, "pg-input")
    box.send_keys("Once upon a time, there was a little dog")
    tokens = d.find_element(By.ID, "pg-max-tokens")
    tokens.clear()
    tokens.send_keys("120")
    temperature = d.find_element(By.ID, "pg-temperature")
    temperature.clear()
    temperature.send_keys("0")  # greedy: the same answer on every run
    d.find_element(By.ID, "pg-send").click()
    console.wait(lambda: console.text("#pg-status") in ("completed", "failed"), "answer done")
    assert console.text("#pg-status") == "completed"
    assert console.text("#pg-bucket") == "short"
    assert console.text("#pg-ttft").endswith(("ms", "s"))
    served = _served_options(console, "#pg-model")  # from /v1/models, the default first
    assert console.attr("#pg-model-used", "title") == served[0]  # the job named its model
    answer = console.text("#pg-output")
    assert answer.strip()
    pieces = d.execute_script("return window.__pieces")
    assert len(set(pieces)) >= 2 and pieces == sorted(pieces), pieces  # streamed, growing
    console.screenshot("playground-answer")
    assert console.errors() == []


def _served_options(console, css):
    """The select's models once /v1/models filled it (its cards' titles count warm workers)."""

    def filled():
        options = console.d.find_elements(By.CSS_SELECTOR, f"{css} option")
        return [o.get_attribute("value") for o in options
                if "warm workers" in (o.get_attribute("title") or "")]  # fmt: skip

    return console.wait(filled, f"{css} filled from /v1/models")


def _the_model_filter_narrows_the_list(console, job_id):
    row = f"tr[data-job='{job_id}']"
    model = console.attr(row, "data-model")
    assert model in _served_options(console, "select[name=model]")
    console.d.execute_script(  # a model none of the jobs ran on
        "document.querySelector('select[name=model]').append(new Option('x', 'no-such-model'))"
    )
    select = Select(console.d.find_element(By.CSS_SELECTOR, "select[name=model]"))
    select.select_by_value("no-such-model")
    console.wait(lambda: not console.visible(row) and console.visible("#main td.empty"), "none")
    select.select_by_value(model)
    console.wait(lambda: console.visible(row), "the job back under its model")


def _row_status(console, job_id):
    return console.attr(f"tr[data-job='{job_id}']", "data-status")


def _pool_actual(console, pool):
    return console.text(f"tr[data-pool='{pool}'] td.actual")


def test_queued_job_completes_while_its_pool_scales_0_1_0(console, console_fleet):
    console.sign_in("key-op")
    console.go("fleet")
    console.wait(lambda: _pool_actual(console, "burst") == "0", "burst pool at zero", 60)
    with console_fleet.client("key-op") as api:  # medium bucket: only the burst pool serves it
        body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
        job = api.post("/v1/jobs", json=body).json()
    assert job["bucket"] == "medium"
    console.go("jobs")
    console.wait(lambda: _row_status(console, job["id"]) == "queued", "the job queued")
    console.screenshot("jobs-queued")
    console.go("fleet")
    console.wait(lambda: _pool_actual(console, "burst") == "1", "burst pool at one", 60)
    console.wait(lambda: console.visible("tr[data-worker^='burst']"), "the burst worker", 60)
    time.sleep(1.5)  # a few points on the plots
    shot = console.screenshot("fleet-scaled-out")
    if os.environ.get("TIDE_UPDATE_SCREENSHOTS") == "1":
        shutil.copy(shot, ROOT / "docs" / "img" / "console-fleet.png")
    assert console.visible("tr[data-decision-pool='burst'][data-action='scale_out']")
    console.go(f"jobs/{job['id']}")
    console.wait(lambda: console.attr("#main", "data-job-status") == "completed", "completed", 60)
    assert console.text("#job-output").strip()
    console.go("fleet")
    console.wait(lambda: _pool_actual(console, "burst") == "0", "burst pool back to zero", 60)
    assert console.visible(
        "tr[data-decision-pool='burst'][data-action='scale_to_min'], "
        "tr[data-decision-pool='burst'][data-action='scale_in']"
    )
    assert console.errors() == []


def _first_running(api, jobs: list[str]) -> tuple[str, str | None] | None:
    """("running", id) for the first job in progress, ("ended", None) once all have ended
    (they ran between two looks), None while some are still queued."""
    statuses = {j: api.get(f"/v1/jobs/{j}").json()["status"] for j in jobs}
    running = next((j for j, s in statuses.items() if s == "in_progress"), None)
    if running is not None:
        return "running", running
    if all(s not in ("queued", "in_progress") for s in statuses.values()):
        return "ended", None
    return None


def _live_worker_pid(console_fleet) -> int:
    with console_fleet.client("key-op") as op:
        workers = op.get("/console/api/fleet").json()["workers"]
    return next(w["pid"] for w in workers if w["pool"] == "live")


@contextlib.contextmanager
def _frozen(pid: int) -> Iterator[None]:
    """SIGSTOP the worker for the length of the block, SIGCONT after whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_cancel_a_running_job(console, console_fleet):
    """The click lands while the live worker is frozen (SIGSTOP) with the job in progress:
    on a fast CPU stories260K writes 280 tokens quicker than a page loads and a click
    lands, so without the freeze every round could end before its cancel (CI saw it)."""
    console.sign_in("key-a")
    body = {"prompt": "Once upon a time", "max_tokens": 280, "ignore_eos": True}
    pid = _live_worker_pid(console_fleet)
    with console_fleet.client("key-a") as api:
        submitted: list[str] = []
        try:
            cancelled = None
            for _ in range(4):  # a round can end between two looks or before the freeze
                jobs = [api.post("/v1/jobs", json=body).json()["id"] for _ in range(8)]
                submitted += jobs
                try:
                    state, running = console.wait(lambda js=jobs: _first_running(api, js),
                                                  "a running job", 60)  # fmt: skip
                except AssertionError as stalled:
                    statuses = [api.get(f"/v1/jobs/{j}").json()["status"] for j in jobs]
                    with console_fleet.client("key-op") as op:
                        fleet = op.get("/console/api/fleet").json()["totals"]
                    raise AssertionError(f"{stalled}; jobs {statuses}; fleet {fleet}") from None
                if state == "ended":
                    continue
                console.go(f"jobs/{running}")
                button = console.wait(lambda: console.visible("#cancel-job:enabled"), "cancel")
                with _frozen(pid):
                    if api.get(f"/v1/jobs/{running}").json()["status"] != "in_progress":
                        continue  # it ended before the freeze: a fresh round
                    button.click()
                    asked = f"/console/api/jobs/{running}"
                    console.wait(lambda u=asked: api.get(u).json()["cancel_requested"], "asked")
                final = console.wait(
                    lambda: console.attr("#main", "data-job-status") in ("cancelled", "completed")
                    and console.attr("#main", "data-job-status"), "the job ended")  # fmt: skip
                assert final == "cancelled", "a job frozen in progress completed after its cancel"
                cancelled = api.get(f"/v1/jobs/{running}").json()
                break
            assert cancelled is not None, "every job ended before its cancel"
            assert cancelled["result"]["finish_reason"] == "abort"
            assert cancelled["usage"]["completion_tokens"] < 280
            console.screenshot("job-cancelled")
        finally:
            for j in submitted:
                api.delete(f"/v1/jobs/{j}")
    assert console.errors() == []


def test_batch_progress_reaches_100_percent(console, console_fleet):
    console.sign_in("key-a")
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": f"Story {i}:", "max_tokens": 16}} for i in range(6)]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with console_fleet.client("key-a") as api:
        f = api.post("/v1/files", files={"file": ("b.jsonl", content)},
                     data={"purpose": "batch"}).json()  # fmt: skip
        create = {"input_file_id": f["id"], "endpoint": "/v1/completions",
                  "completion_window": "24h"}  # fmt: skip
        batch = api.post("/v1/batches", json=create).json()
    console.go("batches")
    row = f"tr[data-batch='{batch['id']}']"
    console.wait(lambda: console.visible(row), "the batch row")
    console.wait(lambda: console.attr(f"{row} .progress", "data-percent") == "100", "100 %", 60)
    console.wait(lambda: console.attr(row, "data-status") == "completed", "completed", 60)
    assert console.visible(f"{row} button[data-file]"), "no output file link"
    assert "6 ✓ 0 ✗ / 6" in console.text(f"{row} .counts")
    console.screenshot("batch-done")
    assert console.errors() == []


def test_tenant_a_never_sees_tenant_b(console, console_fleet):
    with console_fleet.client("key-b") as b, console_fleet.client("key-a") as a:
        body = {"prompt": "secret of b", "max_tokens": 4}
        b_jobs = [b.post("/v1/jobs", json=body).json()["id"] for _ in range(3)]
        a_job = a.post("/v1/jobs", json={"prompt": "mine", "max_tokens": 4}).json()["id"]
    console.sign_in("key-a")
    console.go("jobs")
    console.wait(lambda: console.visible(f"tr[data-job='{a_job}']"), "A's own job")
    time.sleep(1.6)  # one more poll
    source = console.d.page_source
    assert not any(j in source for j in b_jobs)
    _the_model_filter_narrows_the_list(console, a_job)
    console.go(f"jobs/{b_jobs[0]}")
    console.wait(lambda: "not found" in console.text(".status-line"), "B's job refused")
    console.go("fleet")  # tenant A holds no operator key: no fleet-wide view
    console.wait(lambda: "operator key" in console.text("#main"), "the operator notice")
    console.screenshot("tenant-a")
    console.sign_in("key-b")  # the control: B does see its jobs
    console.go("jobs")
    console.wait(lambda: console.visible(f"tr[data-job='{b_jobs[0]}']"), "B's own job")
    assert a_job not in console.d.page_source
