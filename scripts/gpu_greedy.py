"""gpu_check.py's correctness sections: the Triton path against the torch reference on the
device (greedy tokens, CUDA graphs against eager, logits with their top-2 margin), and the
engine against the llama2.c references of stories260K."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def greedy_match(model, smoke: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The same greedy workload on both backends: a shared prefix (hits), a small pool
    (preemptions)."""
    from tide_fleet.kernels import set_attention_backend
    from tide_fleet.worker.engine import SamplingParams
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.llm_engine import LLMEngine

    prefix = [(7 * i) % 200 + 3 for i in range(48 if smoke else 256)]
    prompts = [prefix + [5 + i] * (4 + i) for i in range(4)]
    params = SamplingParams(max_tokens=12 if smoke else 32, temperature=0.0, ignore_eos=True)
    per_seq = -(-(len(prompts[-1]) + params.max_tokens) // 16)
    result: dict[str, Any] = {}
    # On CUDA "triton" replays CUDA graphs for decode steps; on CPU it runs the same padded
    # steps eagerly. "triton_no_graphs" (CUDA only) is the unpadded eager path.
    graphs = "auto" if model.device.type == "cuda" else "eager"
    runs = [("triton", "triton", graphs), ("torch", "torch", "off")]
    if model.device.type == "cuda":
        runs.insert(1, ("triton_no_graphs", "triton", "off"))
    for name, backend, mode in runs:
        config = EngineConfig(num_kv_blocks=per_seq + 1, attention_backend=backend,
                              max_num_batched_tokens=64 if smoke else 512,
                              cuda_graphs=mode)  # fmt: skip
        engine = LLMEngine(model, None, config)
        try:
            outs = engine.generate([list(p) for p in prompts], params)
        finally:
            set_attention_backend("auto")
        stats = engine.stats()
        result[name] = {
            "tokens": [o.token_ids for o in outs],
            "prefix_hits": stats["prefix_cache_hits"],
            "preemptions": stats["num_preemptions"],
        }
        del engine
    a, b = result["triton"]["tokens"], result["torch"]["tokens"]
    diverge = [next((j for j, (x, y) in enumerate(zip(s, t, strict=True)) if x != y), None)
               for s, t in zip(a, b, strict=True)]  # fmt: skip
    graphs_equal = None
    if "triton_no_graphs" in result:
        graphs_equal = result["triton_no_graphs"]["tokens"] == a
    return {
        "equal": a == b,
        "first_divergence": diverge,
        "graphs_equal_eager": graphs_equal,
        **{k: {f: v[f] for f in ("prefix_hits", "preemptions")} for k, v in result.items()},
    }


def logits_gap(model, smoke: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """One greedy request on each backend, eager, every step's logits kept: the largest logit
    difference up to where the tokens first differ, against the torch run's top-2 margin
    there (a margin under the difference is a near-tie that rounding decides, not a fault)."""
    from tide_fleet.kernels import set_attention_backend
    from tide_fleet.worker.engine import SamplingParams
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.llm_engine import LLMEngine

    prompt = [(7 * i) % 200 + 3 for i in range(64 if smoke else 512)]
    params = SamplingParams(max_tokens=8 if smoke else 32, temperature=0.0, ignore_eos=True)
    runs = {}
    for backend in ("triton", "torch"):
        engine = LLMEngine(model, None, EngineConfig(attention_backend=backend, cuda_graphs="off"))
        steps: list[torch.Tensor] = []
        forward = model.forward

        def keep(*args, forward=forward, steps=steps):  # type: ignore[no-untyped-def]
            logits = forward(*args)
            steps.append(logits[-1].float().cpu())
            return logits

        model.forward = keep
        try:
            runs[backend] = (engine.generate([list(prompt)], params)[0].token_ids, steps)
        finally:
            del model.forward
            set_attention_backend("auto")
        del engine
    (a, la), (b, lb) = runs["triton"], runs["torch"]
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    upto = len(a) if n is None else n + 1
    gap = max(float((x - y).abs().max()) for x, y in zip(la[:upto], lb[:upto], strict=False))
    margin = None
    if n is not None:
        top = lb[n].topk(2).values
        margin = round(float(top[0] - top[1]), 5)
    std = round(float(lb[0].std()), 4)
    return {"tokens": len(a), "first_divergence": n, "max_abs_logit_diff": round(gap, 5),
            "logit_std": std, "torch_top2_margin_there": margin}  # fmt: skip


def stories_references(folder: Path, device: torch.device) -> dict[str, Any]:
    """The engine on this device (float32, greedy, default settings: on CUDA the torch
    attention, as head_dim 8 is too small for Triton) against the llama2.c references
    shipped with stories260K, token for token and text for text."""
    from tide_fleet.worker.engine import LLMEngine, SamplingParams

    refs = json.loads((folder / "reference_outputs.json").read_text())["references"]
    engine = LLMEngine.from_pretrained(str(folder), dtype="float32", device=device.type)
    outs = engine.generate(
        [list(r["prompt_ids"]) for r in refs],
        [SamplingParams(max_tokens=r["max_new_tokens"], temperature=0.0) for r in refs],
    )
    matched = [o.token_ids == r["new_ids"] and o.text == r["continuation"]
               for o, r in zip(outs, refs, strict=True)]  # fmt: skip
    first_miss = next((i for i, m in enumerate(matched) if not m), None)
    return {"prompts": len(refs), "matched": sum(matched), "first_mismatch": first_miss,
            "graphs": engine.runner.graph_mode}  # fmt: skip
