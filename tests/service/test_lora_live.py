"""`tide up --lora`: a declared adapter and one an operator loads at run time, served by a
real worker beside their base; answers name the adapter and differ from the base's."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from tests.lora_fixtures import make_adapter
from tests.service.live_up import tide_up

pytestmark = pytest.mark.slow
PROMPT = "Once upon a time, there was a little"


def test_tide_up_serves_declared_and_loaded_adapters(tmp_path, stories_path):  # type: ignore[no-untyped-def]
    sql = make_adapter(tmp_path / "sql", stories_path, 8, ["q_proj", "v_proj", "o_proj"], seed=1)
    mlp = make_adapter(tmp_path / "mlp", stories_path, 4, ["gate_proj", "up_proj"], seed=2)
    flags = ("--workers", "1", "--model", f"stories={stories_path}", "--lora", f"sql={sql}",
             "--dtype", "float32")  # fmt: skip
    with tide_up(tmp_path, *flags) as up:
        url = up.url
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        model = str(stories_path)  # one model: served under its path
        assert [c.id for c in client.models.list().data] == [model, "sql"]

        def greedy(name: str) -> tuple[str, str]:
            r = client.completions.create(model=name, prompt=PROMPT, max_tokens=16, temperature=0)
            return r.model, r.choices[0].text

        base = greedy(model)
        assert greedy("sql")[0] == "sql" and greedy("sql")[1] != base[1]
        loaded = httpx.post(f"{url}/v1/adapters", json={"name": "mlp", "parent": model,
                                                         "path": str(mlp)})  # fmt: skip
        assert loaded.status_code == 201, loaded.text
        assert greedy("mlp")[0] == "mlp" and greedy("mlp")[1] not in (base[1], greedy("sql")[1])
        assert greedy(model) == base  # the base is untouched by its adapters
        assert httpx.delete(f"{url}/v1/adapters/mlp").status_code == 200
        log = up.stop()
    assert "  lora     sql on " in log and "(rank 8)" in log
