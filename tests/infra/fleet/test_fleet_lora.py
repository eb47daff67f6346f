"""LoRA adapters declared in fleet.toml (a pool's ``lora`` table): merged per model into the
served models, refused with the field named when a name is bad or clashes, and checked
against their base before a fleet starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lora_fixtures import make_adapter
from tide_fleet.infra.contract.adapters import AdapterError
from tide_fleet.infra.fleet.fleet_adapters import check_declared, slot_rank
from tide_fleet.infra.fleet.fleet_config import FleetConfig, parse_fleet
from tide_fleet.infra.wire.models import served

BUCKETS = ["short", "medium", "long"]


@pytest.fixture(scope="module")
def adapters(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": make_adapter(root / "sql", stories_path, 8, ["q_proj", "v_proj"], seed=1),
        "wide": make_adapter(root / "wide", stories_path, 32, ["o_proj", "up_proj"], seed=2),
        "huge": make_adapter(root / "huge", stories_path, 72, ["q_proj"], seed=3),
    }


def _fleet(*pools: dict) -> FleetConfig:  # type: ignore[type-arg]
    return parse_fleet({"pools": {p.pop("pool"): {"buckets": BUCKETS} | p for p in pools}})


def test_lora_tables_become_each_models_adapters() -> None:
    fleet = _fleet(
        {"pool": "chat", "model": "/m/llama", "served_name": "llama", "lora": {"sql": "/a/sql"}},
        {"pool": "chat2", "model": "/m/llama", "served_name": "llama", "buckets": ["short"],
         "lora": {"sql": "/a/sql", "support": "s3://b/support"}},
        {"pool": "tiny", "model": "dummy:tiny", "served_name": "tiny"},
    )  # fmt: skip
    specs = fleet.served_models("dummy:tiny")
    assert specs[0]["lora"] == {"sql": "/a/sql", "support": "s3://b/support"}
    assert "lora" not in specs[1]  # no adapters: the served model as before
    cat = served(specs, "dummy:tiny")
    assert cat.is_adapter("support") and cat.resolve("support").name == "llama"  # type: ignore[union-attr]
    assert fleet.needs_served_models()


def test_one_model_with_adapters_tells_its_processes() -> None:
    fleet = _fleet({"pool": "p", "lora": {"sql": "/a/sql"}})
    assert fleet.needs_served_models()
    assert fleet.served_models("/m/base")[0] == {
        "name": "/m/base", "model": "/m/base", "aliases": [], "bucket_short_max": None,
        "bucket_medium_max": None, "lora": {"sql": "/a/sql"},
    }  # fmt: skip
    assert not _fleet({"pool": "p"}).needs_served_models()


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([{"pool": "p", "lora": {"bad name": "/a"}}],
         "pools.p.lora: Value error, adapter name 'bad name': 1 to 128 characters"),
        ([{"pool": "p", "lora": {"sql": " "}}],
         "pools.p.lora: Value error, 'sql': the path is empty"),
        ([{"pool": "a", "model": "/m/1", "served_name": "one", "lora": {"x": "/a/x"}},
          {"pool": "b", "model": "/m/2", "served_name": "two", "lora": {"x": "/a/x"}}],
         "pools.b.lora.x: 'x' is an adapter of pool a's model too"),
        ([{"pool": "a", "served_name": "one", "lora": {"x": "/a/x"}},
          {"pool": "b", "served_name": "one", "lora": {"x": "/a/y"}}],
         "pools.b.lora.x: 'x' is '/a/x' in pool a, not '/a/y'"),
        ([{"pool": "a", "served_name": "one", "aliases": ["uno"], "lora": {"uno": "/a/x"}}],
         "pools.a.lora.uno: 'uno' is a served model's name or alias"),
    ],
)  # fmt: skip
def test_bad_declarations_are_refused_naming_the_field(pools, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as e:
        _fleet(*pools)
    assert message in str(e.value)


def test_declared_adapters_are_checked_against_their_base(stories_path, tiny_path, adapters):  # type: ignore[no-untyped-def]
    good = served([{"name": "stories", "model": str(stories_path),
                    "lora": {"sql": str(adapters["sql"]), "wide": str(adapters["wide"])}},
                   {"name": "remote", "model": "s3://bucket/llama", "lora": {"far": "s3://b/far"}}],
                  str(stories_path))  # fmt: skip
    specs, unchecked = check_declared(good)
    assert {n: s.rank for n, s in specs.items()} == {"sql": 8, "wide": 32}
    assert unchecked == ["far"]  # its base is not on this machine: its workers check it
    bad = served([{"name": "tiny", "model": str(tiny_path), "lora": {"sql": str(adapters["sql"])}}],
                 str(tiny_path))  # fmt: skip
    with pytest.raises(AdapterError) as e:
        check_declared(bad)
    assert str(e.value).startswith("adapter 'sql' on model 'tiny': adapter ")
    assert "the base has 2 layers" in str(e.value)


def test_a_workers_slot_rank_holds_its_models_largest_adapter(stories_path, adapters):  # type: ignore[no-untyped-def]
    def model(*names: str):  # type: ignore[no-untyped-def]
        lora = {n: str(adapters[n]) for n in names}
        return served([{"model": str(stories_path), "lora": lora}], str(stories_path)).default

    assert slot_rank(model()) == 16
    assert slot_rank(model("sql")) == 16  # at least 16
    assert slot_rank(model("sql", "wide")) == 32
    assert slot_rank(model("sql", "huge")) == 16  # one over the limit is refused by workers
