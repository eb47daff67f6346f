"""The operator's adapter routes (POST, DELETE, GET /v1/adapters) and adapter cards in
/v1/models: an adapter is checked against its parent's config before it is recorded; a
bad one is a 400 naming the field and the mismatch, an unknown parent a 404, a taken name
a 409, a declared adapter cannot be unloaded (409); only an operator key may call them."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.live import live_fleet
from tests.lora_fixtures import make_adapter
from tide_fleet.infra.wire.adapters import ADAPTERS_KEY

TENANT = {"Authorization": "Bearer key-a"}
OPERATOR = {"Authorization": "Bearer key-op"}


@pytest.fixture(scope="module")
def adapters(stories_path, tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": make_adapter(root / "sql", stories_path, 8, ["q_proj", "v_proj"], seed=1),
        "mlp": make_adapter(root / "mlp", stories_path, 4, ["gate_proj", "down_proj"], seed=2),
        "huge": make_adapter(root / "huge", stories_path, 72, ["q_proj"], seed=3),
    }


@pytest.fixture(scope="module")
def fleet(redis_server, tiny_path, stories_path, adapters):  # type: ignore[no-untyped-def]
    """stories (the default) with its declared adapter `sql`, and tiny; an operator key."""
    models = [{"name": "stories", "model": str(stories_path), "aliases": ["st"],
               "lora": {"sql": str(adapters["sql"])}},
              {"name": "tiny", "model": str(tiny_path)}]  # fmt: skip
    with live_fleet(redis_server.url, str(stories_path), with_worker=False,
                    served_models=models, admin_keys=["key-op"]) as (gateway, _):  # fmt: skip
        yield gateway


def _load(fleet, headers=OPERATOR, **body) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.post(f"{fleet.url}/v1/adapters", json=body, headers=headers)


def _error(res: httpx.Response) -> tuple[int, str | None, str | None, str]:
    err = res.json()["error"]
    return res.status_code, err["param"], err["code"], err["message"]


def test_models_lists_a_card_per_adapter_with_its_parent(fleet, redis_client, adapters):
    client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="key-a", max_retries=0)
    cards = {c.id: c for c in client.models.list().data}
    assert list(cards) == ["stories", "tiny", "sql"]
    sql = cards["sql"].model_extra or {}
    assert sql["parent"] == "stories" and sql["root"] == str(adapters["sql"])
    assert sql["rank"] == 8 and sql["targets"] == ["q", "v"] and sql["declared"] is True
    assert sql["max_model_len"] == 512 and sql["default"] is False and sql["aliases"] == []
    assert "parent" not in (cards["stories"].model_extra or {})  # a model's card as before
    one = client.models.retrieve("sql")
    assert one.id == "sql" and (one.model_extra or {})["parent"] == "stories"


def test_an_operator_loads_an_adapter_and_requests_reach_it(fleet, redis_client, adapters):
    res = _load(fleet, name="mlp-v1", parent="st", path=str(adapters["mlp"]))
    assert res.status_code == 201, res.text
    card = res.json()
    assert (card["id"], card["parent"], card["rank"], card["declared"]) == (
        "mlp-v1", "stories", 4, False,
    )  # fmt: skip
    assert card["targets"] == ["down", "gate"] and card["root"] == str(adapters["mlp"])
    listed = httpx.get(f"{fleet.url}/v1/adapters", headers=OPERATOR).json()["data"]
    assert [(c["id"], c["declared"]) for c in listed] == [("mlp-v1", False), ("sql", True)]
    models = httpx.get(f"{fleet.url}/v1/models", headers=TENANT).json()["data"]
    assert "mlp-v1" in [c["id"] for c in models]
    job = httpx.post(f"{fleet.url}/v1/jobs", headers=TENANT,
                     json={"model": "mlp-v1", "prompt": "Once", "max_tokens": 4})  # fmt: skip
    assert job.status_code == 202 and job.json()["model"] == "mlp-v1"
    assert redis_client.hget(f"tide:job:{job.json()['id']}", "lora") == b"mlp-v1"

    res = httpx.delete(f"{fleet.url}/v1/adapters/mlp-v1", headers=OPERATOR)
    assert res.status_code == 200 and res.json() == {
        "id": "mlp-v1", "object": "model", "deleted": True,
    }  # fmt: skip
    assert not redis_client.hexists(ADAPTERS_KEY, "mlp-v1")
    gone = httpx.post(f"{fleet.url}/v1/jobs", headers=TENANT,
                      json={"model": "mlp-v1", "prompt": "Once", "max_tokens": 4})  # fmt: skip
    assert gone.status_code == 404
    res = httpx.delete(f"{fleet.url}/v1/adapters/mlp-v1", headers=OPERATOR)
    assert _error(res)[:3] == (404, None, "adapter_not_found")


def test_an_adapter_that_does_not_fit_its_parent_is_a_400_naming_the_mismatch(
    fleet, redis_client, adapters
):
    res = _load(fleet, name="mlp-tiny", parent="tiny", path=str(adapters["mlp"]))
    status, param, code, message = _error(res)
    assert (status, param, code) == (400, "path", "invalid_adapter")
    assert "is for layer 2; the base has 2 layers" in message, message
    status, param, _, message = _error(_load(fleet, name="huge", parent="stories",
                                             path=str(adapters["huge"])))  # fmt: skip
    assert (status, param) == (400, "path") and "rank 72 is over the limit of 64" in message
    status, param, _, message = _error(_load(fleet, name="x", parent="stories", path="/nowhere"))
    assert (status, param) == (400, "path") and "adapter_config.json" in message
    assert redis_client.hlen(ADAPTERS_KEY) == 0


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"name": "bad name!", "parent": "stories"}, (400, "name", "invalid_name")),
        ({"name": "ok", "parent": "gpt-4o"}, (404, "parent", "model_not_found")),
        ({"name": "ok", "parent": "sql"}, (400, "parent", "invalid_parent")),
        ({"name": "sql", "parent": "stories"}, (409, "name", "name_taken")),  # declared
        ({"name": "tiny", "parent": "stories"}, (409, "name", "name_taken")),  # a model
        ({"name": "st", "parent": "stories"}, (409, "name", "name_taken")),  # an alias
        ({"name": "ok", "parent": "stories", "rank": 8}, (400, "rank", "extra_forbidden")),
        ({"name": "ok", "parent": "stories", "path": ""}, (400, "path", "string_too_short")),
    ],
)
def test_refusals_name_the_field(fleet, redis_client, adapters, body, expected):
    res = _load(fleet, **({"path": str(adapters["mlp"])} | body))
    assert _error(res)[:3] == expected, res.text
    assert redis_client.hlen(ADAPTERS_KEY) == 0


def test_a_name_loaded_already_is_a_409(fleet, redis_client, adapters):
    assert (
        _load(fleet, name="twice", parent="stories", path=str(adapters["mlp"])).status_code == 201
    )
    res = _load(fleet, name="twice", parent="stories", path=str(adapters["sql"]))
    assert _error(res)[:3] == (409, "name", "name_taken")


def test_a_declared_adapter_cannot_be_unloaded(fleet, redis_client):
    res = httpx.delete(f"{fleet.url}/v1/adapters/sql", headers=OPERATOR)
    assert _error(res)[:3] == (409, None, "adapter_declared")
    assert "fixed for the fleet's life" in _error(res)[3]


def test_only_an_operator_key_may_load_or_unload(fleet, redis_client, adapters):
    body = {"name": "mine", "parent": "stories", "path": str(adapters["mlp"])}
    assert httpx.post(f"{fleet.url}/v1/adapters", json=body, headers=TENANT).status_code == 403
    assert httpx.post(f"{fleet.url}/v1/adapters", json=body).status_code == 401
    assert httpx.delete(f"{fleet.url}/v1/adapters/mine", headers=TENANT).status_code == 403
    assert httpx.get(f"{fleet.url}/v1/adapters", headers=TENANT).status_code == 403
    assert redis_client.hlen(ADAPTERS_KEY) == 0
