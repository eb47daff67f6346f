"""A batch file may name one LoRA adapter as every line's model: its jobs run on the
parent (its tokenizer and lane) with the adapter in ``lora``, and the batch and its output
name the adapter. An adapter is a model of its own: lines naming it and its parent differ."""

from __future__ import annotations

import json

import pytest

from tests.infra.batches.conftest import line
from tests.lora_fixtures import make_adapter
from tide_fleet.infra.batches.finalize import finalize_batch
from tide_fleet.infra.batches.validate import check_envelopes, validate_batch
from tide_fleet.infra.jobs.submission import ModelInfo
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.adapters import ADAPTERS_KEY, AdapterRef
from tide_fleet.infra.wire.models import catalog
from tide_fleet.infra.wire.protocol import queue_name

OK = {"prompt": "Once upon a time", "max_tokens": 40}


@pytest.fixture(scope="module")
def sql_adapter(stories_path, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("adapters") / "sql"
    return make_adapter(folder, stories_path, 8, ["q_proj", "v_proj"], seed=1)


@pytest.fixture
def two(make_world, tiny_path, stories_path, sql_adapter):  # type: ignore[no-untyped-def]
    models = [{"name": "tiny", "model": str(tiny_path)},
              {"name": "stories", "model": str(stories_path), "bucket_short_max": 32,
               "lora": {"sql": str(sql_adapter)}}]  # fmt: skip
    return make_world(Settings(model=str(tiny_path), served_models=models))


def _lines(*models: str | None) -> str:
    bodies = [OK | ({"model": m} if m is not None else {}) for m in models]
    return "\n".join(line(f"r{i}", b) for i, b in enumerate(bodies)) + "\n"


def _queued(world) -> dict[str, int]:  # type: ignore[no-untyped-def]
    r = world.h.client
    return {
        k.decode().removesuffix(":deadlines"): r.zcard(k)
        for k in r.keys("tide.*:deadlines")
        if r.type(k) == b"zset"
    }


def test_a_batch_naming_an_adapter_runs_on_its_parent_with_lora(two, stories_path):
    batch_id = two.new_batch(_lines("sql", "sql"))
    assert validate_batch(batch_id) == "in_progress"
    assert two.h.batches.get(batch_id)["model"] == "sql"
    assert _queued(two) == {queue_name("medium", "batch", "stories"): 2}  # the parent's lane
    stories = ModelInfo.load(str(stories_path))
    for job_id in two.job_ids(batch_id):
        job = two.h.jobs.get(job_id)
        assert (job["model"], job["lora"]) == ("stories", "sql")
        assert json.loads(job["token_ids"]) == stories.encode(OK["prompt"])
        two.finish(job_id)
    two.h.batches.transition(batch_id, ["in_progress"], status="finalizing")
    assert finalize_batch(batch_id) == "completed"
    out = two.h.files.get(two.h.batches.get(batch_id)["output_file_id"])
    with two.h.files.storage.open(out["storage_key"]) as f:
        rows = [json.loads(x) for x in f.read().splitlines()]
    assert [r["response"]["body"]["model"] for r in rows] == ["sql", "sql"]


def test_an_adapter_loaded_at_run_time_may_be_a_batchs_model(two, sql_adapter):
    ref = AdapterRef("sql-v2", "stories", str(sql_adapter))
    two.h.client.hset(ADAPTERS_KEY, ref.name, ref.to_json())
    batch_id = two.new_batch(_lines("sql-v2"))
    assert validate_batch(batch_id) == "in_progress"
    (job_id,) = two.job_ids(batch_id)
    assert two.h.jobs.get(job_id)["lora"] == "sql-v2"


def test_lines_naming_an_adapter_and_its_parent_fail_the_file(two):
    cat = catalog(two.h.settings)
    file = two.upload(_lines("sql", "stories", "sql"))
    check = check_envelopes(two.h.files, file, "/v1/completions", 100, cat, two.h.client)
    assert [(e["code"], e["line"], e["param"]) for e in check.errors] == [
        ("mismatched_model", 2, "body.model")
    ]
    assert check.errors[0]["message"] == (
        "line 2: model 'stories' differs from the batch's model 'sql' (line 1); a batch "
        "file takes one model"
    )
    batch_id = two.new_batch(_lines("sql", "nope"))
    assert validate_batch(batch_id) == "failed"
    (error,) = json.loads(two.h.batches.get(batch_id)["errors"])
    assert (error["code"], error["line"]) == ("model_not_found", 2)
    assert not two.h.batches.lines(batch_id) and _queued(two) == {}
