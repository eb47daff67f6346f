"""fleet.toml and `tide up --model A --model B`: one pool family per served model."""

from __future__ import annotations

import pytest

from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.fleet.local_actuator import LocalActuator
from tide_fleet.infra.fleet.local_fleet import local_default_fleet

ALL = ["short", "medium", "long"]


def test_two_models_each_with_their_own_pools_and_home_buckets() -> None:
    fleet = parse_fleet({"pools": {
        "a": {"buckets": ALL, "model": "/m/a", "served_name": "a", "aliases": ["alpha"]},
        "b-small": {"buckets": ["short"], "model": "/m/b", "served_name": "b",
                    "bucket_short_max": 64},
        "b-big": {"buckets": ["medium", "long", "short"], "model": "/m/b", "served_name": "b"},
    }})  # fmt: skip
    assert fleet.model_keys() == ["a", "b"]
    assert fleet.home_buckets("a") == ALL  # another model's pools do not take its buckets
    assert fleet.home_buckets("b-small") == ["short"]
    assert fleet.home_buckets("b-big") == ["medium", "long"]
    assert fleet.pool_lanes("dummy:tiny") == {"a": "", "b-small": "b", "b-big": "b"}
    models = fleet.served_models("dummy:tiny")
    assert [m["name"] for m in models] == ["a", "b"]
    assert models[0]["aliases"] == ["alpha"] and models[1]["bucket_short_max"] == 64
    later = parse_fleet(
        {"default_model": "b", "pools": fleet.model_dump(include={"pools"})["pools"]}
    )
    assert later.model_keys() == ["b", "a"] and later.pool_lanes("x")["a"] == "a"


def test_each_model_needs_every_bucket_and_one_weights_path() -> None:
    with pytest.raises(ValueError, match="no pool of model 'b' serves bucket"):
        parse_fleet({"pools": {"a": {"buckets": ALL, "served_name": "a"},
                               "b": {"buckets": ["short"], "served_name": "b"}}})  # fmt: skip
    with pytest.raises(ValueError, match="another pool's model"):
        x1 = {"buckets": ALL, "served_name": "x", "model": "/1"}
        parse_fleet({"pools": {"a": x1, "b": x1 | {"model": "/2"}}})
    with pytest.raises(ValueError, match="default_model 'z'"):
        parse_fleet({"default_model": "z", "pools": {"a": {"buckets": ALL}}})


def test_tide_up_with_two_models_makes_a_scale_to_zero_pool_each() -> None:
    one = local_default_fleet(0, 2, models=["dummy:tiny"])
    assert list(one.pools) == ["default"] and one.model_keys() == [""]  # as before
    fleet = local_default_fleet(0, 2, models=["dummy:tiny", "story=/m/stories260K"])
    assert list(fleet.pools) == ["dummy-tiny", "story"]
    assert [p.min_workers for p in fleet.pools.values()] == [0, 0]
    assert fleet.served_models("dummy:tiny")[1] == {
        "name": "story", "model": "/m/stories260K", "aliases": [],
        "bucket_short_max": None, "bucket_medium_max": None,
    }  # fmt: skip
    # Its workers are told which model they serve, so they take only its queues.
    actuator = LocalActuator(fleet, env={"TIDE_MODEL": "dummy:tiny"})
    argv: list[list[str]] = []
    import tide_fleet.infra.fleet.local_actuator as la

    real, la.spawn = la.spawn, lambda a, env, log_file=None: argv.append(a) or _Fake()  # type: ignore[assignment,func-returns-value]
    try:
        actuator.launch(fleet.pools["story"], 1)
    finally:
        la.spawn = real  # type: ignore[assignment]
    assert argv[0][-4:] == ["--model", "/m/stories260K", "--served-model", "story"]


class _Fake:
    pid = 1

    def poll(self) -> None:
        return None
