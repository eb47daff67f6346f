"""Which part of each tensor a rank holds, read from the checkpoint as slices."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors import safe_open

from tide_fleet.infra.contract.model_config import ModelConfig, ModelLoadError
from tide_fleet.worker.models.loader import load_model
from tide_fleet.worker.parallel.group import TensorParallel
from tide_fleet.worker.parallel.shard import Shard, ShardLayout, check_divides


def dense(t: torch.Tensor) -> torch.Tensor:
    """A weight as stored (the CPU matmuls may keep it packed for oneDNN)."""
    return t.to_dense() if t.is_mkldnn else t


def test_sizes_that_do_not_split_the_model_are_refused_naming_those_that_do(stories_path):
    config = ModelConfig.from_folder(stories_path)  # 8 heads, 4 KV heads, intermediate 172
    check_divides(config, 4)
    with pytest.raises(ModelLoadError, match=r"does not divide the model's KV heads \(4\); "
                       r"sizes that split this model: 1, 2, 4"):  # fmt: skip
        check_divides(config, 3)
    odd = dataclasses.replace(config, intermediate_size=171)
    with pytest.raises(ModelLoadError, match=r"intermediate size \(171\).*: 1$"):
        check_divides(odd, 2)


def test_a_rank_runs_its_heads_and_its_part_of_the_mlp(stories_path):
    config = ModelConfig.from_folder(stories_path)
    layout = ShardLayout(config, Shard(1, 2))
    local = layout.local_config
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (4, 2, 86)
    assert (local.vocab_size, local.hidden_size, local.head_dim) == (512, 64, 8)
    assert layout.q_rows() == (32, 64) and layout.kv_rows() == (16, 32)
    assert layout.mlp_rows() == (86, 172)
    assert not layout.adds_row_bias and ShardLayout(config, Shard(0, 2)).adds_row_bias


def test_vocabulary_parts_are_padded_to_one_size():
    config = ModelConfig("LlamaForCausalLM", 10, 8, 8, 1, 2, 2, 4, 64)
    parts = [ShardLayout(config, Shard(r, 3)) for r in range(3)]
    assert [p.vocab_rows for p in parts] == [4, 4, 4]
    assert [p.vocab_range() for p in parts] == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match="rank 3 is outside a world of 3"):
        Shard(3, 3)


def test_a_rank_loads_exactly_its_slices_of_the_checkpoint(stories_path):
    """Rank 1 of 2 (loading needs no collectives): its fused q|k|v is its heads' rows of
    q, k and v; o and down their input columns; the tied embedding its vocabulary rows."""
    tp = TensorParallel(Shard(1, 2), torch.device("cpu"))
    model = load_model(stories_path, "float32", tp=tp)
    with safe_open(str(stories_path / "model.safetensors"), framework="pt") as f:

        def w(name: str) -> torch.Tensor:
            return f.get_tensor(f"model.layers.2.{name}.weight")

        layer = model.layers[2]
        qkv = torch.cat([w("self_attn.q_proj")[32:64], w("self_attn.k_proj")[16:32],
                         w("self_attn.v_proj")[16:32]])  # fmt: skip
        assert torch.equal(dense(layer.qkv.weight), qkv)
        assert torch.equal(dense(layer.o.weight), w("self_attn.o_proj")[:, 32:64])
        gate_up = torch.cat([w("mlp.gate_proj")[86:], w("mlp.up_proj")[86:]])
        assert torch.equal(dense(layer.gate_up.weight), gate_up)
        assert torch.equal(dense(layer.down.weight), w("mlp.down_proj")[:, 86:])
        assert torch.equal(layer.input_norm, w("input_layernorm"))
        assert torch.equal(model.embed, f.get_tensor("model.embed_tokens.weight")[256:])
    assert torch.equal(dense(model.lm_head.weight), model.embed)  # tied: the same rows
    assert model.vocab_start == 256
    assert model.config.num_kv_heads == 2


def test_a_sharded_checkpoint_gives_a_rank_the_same_slices(stories_path, tmp_path):
    """The same tensors split over two files and an index (how large checkpoints ship)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(stories_path / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(tmp_path / file))
    index = {"weight_map": {n: f for f, part in halves.items() for n in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(stories_path / "config.json", tmp_path / "config.json")
    tp = TensorParallel(Shard(1, 2), torch.device("cpu"))
    whole, split = (load_model(p, "float32", tp=tp) for p in (stories_path, tmp_path))
    assert torch.equal(whole.embed, split.embed)
    for a, b in zip(whole.layers, split.layers, strict=True):
        for name in ("qkv", "o", "gate_up", "down"):
            assert torch.equal(dense(getattr(a, name).weight), dense(getattr(b, name).weight))
