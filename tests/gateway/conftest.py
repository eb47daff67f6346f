"""Gateway fixtures: a live gateway on loopback with a fake worker (tests/gateway/live.py),
and a model folder whose chat template shows tools."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from openai import OpenAI

from tests.gateway.live import live_fleet

TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{% if m.tool_calls %}{{ m.tool_calls | tojson }}"
    "{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="session")
def tools_model(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dummy:tiny with a chat template that shows the tools it is given."""
    folder = tmp_path_factory.mktemp("tools-model") / "tiny-tools"
    shutil.copytree(tiny_path, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOLS_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def fleet(redis_server, tiny_path):  # type: ignore[no-untyped-def]
    """A live gateway serving dummy:tiny's folder, and a fake worker behind it."""
    with live_fleet(redis_server.url, str(tiny_path)) as pair:
        yield pair


@pytest.fixture
def oai(fleet, redis_client):  # type: ignore[no-untyped-def]
    """The official client against the live gateway (Redis flushed for each test)."""
    gateway, worker = fleet
    worker.seen.clear()
    from tests.gateway.live import default_script

    worker.script = default_script
    return OpenAI(base_url=f"{gateway.url}/v1", api_key="key-a", max_retries=0, timeout=20)
