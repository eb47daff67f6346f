"""LoRA adapters against peft on transformers, the same base and adapter files.

Adapters of several ranks and target sets are written by peft itself (random, not zero, B)
on stories260K. Tide's float32 greedy ids equal peft's for each adapter alone, and mixed
in one batch with the other adapters and base requests; under chunked prefill, prefix
hits, preemption, and more adapters than device slots (eviction).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.lora_fixtures import ATTENTION, MLP, make_adapter
from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.worker.engine.llm_engine import LLMEngine

NEW_TOKENS = 12
ADAPTERS = {  # name: (rank, targets, seed, alpha)
    "qv-r8": (8, ("q_proj", "v_proj", "down_proj"), 1, None),
    "all-r16": (16, (*ATTENTION, *MLP), 2, 8.0),
    "mlp-r4": (4, ("o_proj", "gate_proj", "up_proj"), 3, None),
}


@pytest.fixture(scope="module")
def adapters(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: make_adapter(root / name, stories_path, r, targets, seed, alpha)
        for name, (r, targets, seed, alpha) in ADAPTERS.items()
    }


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(3, 500, (40,), generator=g).tolist()
    return [[1, *torch.randint(3, 500, (n,), generator=g).tolist()] for n in (5, 23, 57)] + [
        [1, *shared, 7, 8],
        [1, *shared, 9],
    ]  # two sharing a 41-token prefix


def _greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out: list[int] = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


@pytest.fixture(scope="module")
def references(stories_path: Path, adapters: dict[str, Path]) -> dict[str | None, list]:
    """peft's greedy ids per adapter (None: the base) and prompt."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(stories_path), dtype=torch.float32).eval()
    refs: dict[str | None, list] = {None: [_greedy(base, p) for p in _prompts()]}
    for name, folder in adapters.items():
        fresh = AutoModelForCausalLM.from_pretrained(str(stories_path), dtype=torch.float32)
        model = PeftModel.from_pretrained(fresh, str(folder)).eval()
        refs[name] = [_greedy(model, p) for p in _prompts()]
    for name in adapters:
        assert refs[name] != refs[None], f"{name} changes nothing: the test could not fail"
    return refs


def _engine(stories_path: Path, adapters: dict[str, Path], **config) -> LLMEngine:
    config.setdefault("max_loras", 2)
    engine = LLMEngine.from_pretrained(
        str(stories_path), dtype="float32", max_lora_rank=16, kv_cache_memory=64 << 20,
        **config,
    )  # fmt: skip
    for name, folder in adapters.items():
        engine.register_adapter(name, str(folder))
    return engine


def _run(engine: LLMEngine, jobs: list[tuple[str | None, int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    prompts = _prompts()
    for k, (lora, p) in enumerate(jobs):
        engine.add_request(f"r{k}", prompts[p], params, lora=lora)
    done: dict[str, list[int]] = {}
    while len(done) < len(jobs):
        for out in engine.step():
            if out.finished:
                assert out.finish_reason == "length", out.error
                done[out.request_id] = out.token_ids
    engine.block_manager.assert_all_free()
    return [done[f"r{k}"] for k in range(len(jobs))]


def _everything() -> list[tuple[str | None, int]]:
    return [(lora, p) for p in range(len(_prompts())) for lora in (None, *ADAPTERS)]


def test_each_adapter_alone_equals_peft(stories_path, adapters, references):
    engine = _engine(stories_path, adapters)
    for name in ADAPTERS:
        got = _run(engine, [(name, p) for p in range(len(_prompts()))])
        assert got == references[name], name


def test_adapters_and_base_mixed_in_one_batch_equal_peft(stories_path, adapters, references):
    """Every adapter and the base at once, more adapters than slots: the third waits for
    a slot, then evicts the least recently used one."""
    engine = _engine(stories_path, adapters, max_loras=2)
    jobs = _everything()
    got = _run(engine, jobs)
    for (lora, p), ids in zip(jobs, got, strict=True):
        assert ids == references[lora][p], (lora, p)
    stats = engine.stats()["lora"]
    assert stats["loads"] >= 3 and stats["evictions"] >= 1


def test_chunked_prefill_and_prefix_hits_equal_peft(stories_path, adapters, references):
    """Prompts cut into 8-token chunks; the shared 41-token prefix is cached per adapter and
    hit by its second prompt under the same adapter only."""
    engine = _engine(stories_path, adapters, max_loras=3, max_num_batched_tokens=8,
                     block_size=8)  # fmt: skip
    jobs = _everything()
    got = _run(engine, jobs)
    for (lora, p), ids in zip(jobs, got, strict=True):
        assert ids == references[lora][p], (lora, p)
    again = _run(engine, [(name, 4) for name in (None, *ADAPTERS)])
    assert again == [references[name][4] for name in (None, *ADAPTERS)]
    assert engine.block_manager.prefix_hits > 0


def test_preemption_under_a_small_pool_equals_peft(stories_path, adapters, references):
    engine = _engine(stories_path, adapters, max_loras=3, num_kv_blocks=12, block_size=8,
                     max_num_batched_tokens=64)  # fmt: skip
    jobs = _everything()
    got = _run(engine, jobs)
    for (lora, p), ids in zip(jobs, got, strict=True):
        assert ids == references[lora][p], (lora, p)
    assert engine.scheduler.num_preemptions > 0


def test_the_torch_forward_equals_peft(stories_path, adapters, references):
    """The op-by-op torch spelling (what CUDA runs) with its LoRA deltas, on CPU."""
    engine = _engine(stories_path, adapters, max_loras=3)
    engine.model.native = None
    jobs = _everything()[:8]
    got = _run(engine, jobs)
    assert got == [references[lora][p] for lora, p in jobs]


def _fused_pair(split: Path, fused: Path) -> None:
    """Rewrite a q,k,v,gate,up adapter so k and v share q's A and up shares gate's (the
    split form, peft's reference), and write the same as qkv_proj and gate_up_proj."""
    import json

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(split / "adapter_model.safetensors"))
    out = {}
    for key in list(tensors):
        if ".q_proj.lora_A" in key:
            for other in ("k_proj", "v_proj"):
                tensors[key.replace("q_proj", other)] = tensors[key].clone()
            parts = [tensors[key.replace("q_proj.lora_A", f"{m}.lora_B")] for m in
                     ("q_proj", "k_proj", "v_proj")]  # fmt: skip
            out[key.replace("q_proj", "qkv_proj")] = tensors[key]
            out[key.replace("q_proj.lora_A", "qkv_proj.lora_B")] = torch.cat(parts)
        if ".gate_proj.lora_A" in key:
            tensors[key.replace("gate_proj", "up_proj")] = tensors[key].clone()
            parts = [tensors[key.replace("gate_proj.lora_A", f"{m}.lora_B")] for m in
                     ("gate_proj", "up_proj")]  # fmt: skip
            out[key.replace("gate_proj", "gate_up_proj")] = tensors[key]
            out[key.replace("gate_proj.lora_A", "gate_up_proj.lora_B")] = torch.cat(parts)
    save_file(tensors, str(split / "adapter_model.safetensors"))
    fused.mkdir()
    save_file({k: v.contiguous() for k, v in out.items()}, str(fused / "adapter_model.safetensors"))
    config = json.loads((split / "adapter_config.json").read_text())
    config["target_modules"] = ["qkv_proj", "gate_up_proj"]
    (fused / "adapter_config.json").write_text(json.dumps(config))


def test_fused_qkv_and_gate_up_modules_equal_their_parts(stories_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    split = make_adapter(tmp_path / "split", stories_path, 8,
                         ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), 9)  # fmt: skip
    _fused_pair(split, tmp_path / "fused")
    base = AutoModelForCausalLM.from_pretrained(str(stories_path), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(split)).eval()
    expected = [_greedy(model, p) for p in _prompts()]
    engine = _engine(stories_path, {"fused": tmp_path / "fused"}, max_loras=1)
    assert _run(engine, [("fused", p) for p in range(len(_prompts()))]) == expected
