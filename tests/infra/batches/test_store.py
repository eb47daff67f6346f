"""The batch record: windows, create and read back, tenant isolation, paging, guarded moves."""

from __future__ import annotations

import json

import pytest

from tide_fleet.infra.batches.store import REFUSED, BatchStore, new_batch_id, parse_window, refusal
from tide_fleet.infra.wire.protocol import Keys


@pytest.mark.parametrize(("window", "seconds"), [("24h", 86400), ("90m", 5400), ("5s", 5)])
def test_parse_window(window, seconds):
    assert parse_window(window) == seconds


@pytest.mark.parametrize("window", ["0h", "24", "1d", "h", " 24h", "-1h"])
def test_parse_window_refuses(window):
    with pytest.raises(ValueError, match="completion_window"):
        parse_window(window)


def _record(batch_id: str, tenant: str = "t", created_at: float = 100.0) -> dict:
    return {
        "id": batch_id, "tenant": tenant, "status": "validating", "created_at": created_at,
        "metadata": {"k": "v"}, "webhook_url": None, "total": "", "completed": 0,
    }  # fmt: skip


def test_create_and_get(redis_client):
    store = BatchStore(redis_client)
    batch_id = new_batch_id()
    store.create(_record(batch_id))
    got = store.get(batch_id)
    assert got == {
        "id": batch_id, "tenant": "t", "status": "validating", "created_at": "100.0",
        "metadata": '{"k": "v"}', "webhook_url": "", "total": "", "completed": "0",
    }  # fmt: skip
    assert store.get(batch_id, tenant="t") == got
    assert store.get(batch_id, tenant="other") is None
    assert store.get("batch_missing") is None


def test_list_is_newest_first_and_pages(redis_client):
    store = BatchStore(redis_client)
    for i in range(5):
        store.create(_record(f"b{i}", created_at=100.0 + i))
    store.create(_record("x", tenant="other", created_at=200.0))
    page, more = store.list("t", None, 2)
    assert [b["id"] for b in page] == ["b4", "b3"] and more
    page, more = store.list("t", "b3", 2)
    assert [b["id"] for b in page] == ["b2", "b1"] and more
    page, more = store.list("t", "b1", 2)
    assert [b["id"] for b in page] == ["b0"] and not more


def test_transition_only_from_the_expected_status(redis_client):
    store = BatchStore(redis_client)
    store.create(_record("b"))
    assert not store.transition("b", ["in_progress"], status="finalizing")
    assert store.get("b")["status"] == "validating"
    errors = [{"code": "empty_file", "line": None}]
    assert store.transition("b", ["in_progress", "validating"], status="failed", errors=errors)
    got = store.get("b")
    assert got["status"] == "failed" and json.loads(got["errors"]) == errors


def test_update_and_lines(redis_client):
    store = BatchStore(redis_client)
    store.create(_record("b"))
    store.update("b", completed=3, stop="1")
    assert store.get("b")["completed"] == "3" and store.get("b")["stop"] == "1"
    redis_client.hset(Keys.batch_lines("b"), mapping={"0": "job_a", "1": refusal(400, "no", "c")})
    assert store.lines("b") == {0: "job_a", 1: refusal(400, "no", "c")}


def test_refusal_entry():
    entry = refusal(400, "body.max_tokens: too big", "row-7", "body.max_tokens")
    assert entry.startswith(REFUSED)
    assert json.loads(entry.removeprefix(REFUSED)) == {
        "status": 400, "message": "body.max_tokens: too big", "custom_id": "row-7",
        "param": "body.max_tokens",
    }  # fmt: skip
