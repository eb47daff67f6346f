"""Reading PEFT adapter folders and checking them against a base (infra/contract/adapters.py):
what fits is read with its modules, ranks and scalings; what does not is refused naming the
field, the tensor and the limit; an s3:// prefix is fetched once into the cache."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.lora_fixtures import make_adapter
from tide_fleet.infra.contract.adapters import AdapterError, read_adapter
from tide_fleet.infra.contract.model_config import ModelConfig


@pytest.fixture(scope="module")
def base(stories_path: Path) -> ModelConfig:
    return ModelConfig.from_folder(stories_path)


@pytest.fixture(scope="module")
def adapter(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(tmp_path_factory.mktemp("a") / "qv", stories_path, 8,
                        ("q_proj", "v_proj", "down_proj"), 1, alpha=4)  # fmt: skip


def _variant(adapter: Path, tmp_path: Path, **config_changes) -> Path:
    folder = tmp_path / "variant"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(
        (adapter / "adapter_model.safetensors").read_bytes()
    )
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg.update(config_changes)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def test_a_fitting_adapter_is_read_with_its_modules(adapter, base):
    spec = read_adapter("qv", str(adapter), base)
    assert spec.rank == 8 and spec.targets == ["down", "q", "v"]
    assert len(spec.modules) == 3 * base.num_layers
    assert {m.scaling for m in spec.modules} == {0.5}  # lora_alpha 4 / r 8


def test_rslora_and_alpha_pattern_set_the_scaling(adapter, base, tmp_path):
    folder = _variant(adapter, tmp_path, use_rslora=True, alpha_pattern={"down_proj": 16})
    spec = read_adapter("qv", str(folder), base)
    by_module = {m.module: m.scaling for m in spec.modules}
    assert by_module["q"] == pytest.approx(4 / math.sqrt(8))
    assert by_module["down"] == pytest.approx(16 / math.sqrt(8))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"use_dora": True}, "use_dora"),
        ({"bias": "all"}, "bias 'all'"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"peft_type": "IA3"}, "peft_type 'IA3'"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ],
)
def test_unsupported_config_fields_are_refused_by_name(adapter, base, tmp_path, change, named):
    with pytest.raises(AdapterError, match=named):
        read_adapter("x", str(_variant(adapter, tmp_path, **change)), base)


def test_a_rank_over_the_limit_is_refused_naming_both(adapter, base):
    with pytest.raises(AdapterError, match="rank 8 is over the limit of 4"):
        read_adapter("qv", str(adapter), base, max_rank=4)


def test_an_adapter_for_another_base_is_refused_naming_the_shapes(adapter, tiny_path):
    other = ModelConfig.from_folder(tiny_path)
    with pytest.raises(AdapterError, match=r"lora_A \[8, 64\].*do not fit the base|layers"):
        read_adapter("qv", str(adapter), other)


def test_an_embedding_adapter_is_refused_naming_the_tensor(stories_path, base, tmp_path):
    folder = make_adapter(tmp_path / "emb", stories_path, 4, ("q_proj", "lm_head"), 2)
    with pytest.raises(AdapterError, match=r"lm_head.*not on a projection Tide adapts"):
        read_adapter("emb", str(folder), base)


def test_missing_files_and_bad_names_are_refused(adapter, base, tmp_path):
    with pytest.raises(AdapterError, match=r"no adapter_config\.json"):
        read_adapter("x", str(tmp_path), base)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(AdapterError, match=r"no adapter_model\.safetensors"):
        read_adapter("x", str(tmp_path), base)
    with pytest.raises(AdapterError, match="adapter name"):
        read_adapter("bad name!", str(adapter), base)


def test_an_s3_prefix_is_fetched_once_into_the_cache(adapter, base, moto_url, tmp_path,
                                                     monkeypatch):  # fmt: skip
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_url)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="adapters")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        s3.upload_file(str(adapter / name), "adapters", f"team/qv/{name}")
    spec = read_adapter("qv", "s3://adapters/team/qv", base, cache_dir=tmp_path)
    assert spec.folder.parent == tmp_path / "adapters" and spec.rank == 8
    s3.delete_object(Bucket="adapters", Key="team/qv/adapter_model.safetensors")
    assert read_adapter("qv", "s3://adapters/team/qv", base, cache_dir=tmp_path).rank == 8
    with pytest.raises(AdapterError, match="cannot fetch it from S3"):
        read_adapter("gone", "s3://adapters/team/none", base, cache_dir=tmp_path)
