"""gpu_check.py's section for steps that carry prefill: a prefill chunk beside decode
rows, its layers replayed as captured pieces around attention and run eagerly, side by
side (the same inputs, so the logits are compared too); and the greedy tokens of a
chunked-prefill workload both ways."""

from __future__ import annotations

from typing import Any

import torch
from gpu_decode import device_time

FULL = dict(cases=((64, 32), (256, 32), (448, 64)), context=512, reps=20, largest=512)
SMOKE = dict(cases=((24, 4), (40, 2)), context=48, reps=3, largest=48)


def _mixed_sched(chunk: int, decodes: int, context: int, bs: int):  # type: ignore[no-untyped-def]
    """Decode rows at ``context`` and one prefill chunk of ``chunk`` new tokens."""
    from tide_fleet.worker.engine.scheduler import ScheduledRequest, SchedulerOutput

    width = -(-context // bs)
    rows = [ScheduledRequest(f"d{i}", [1], context - 1, list(range(i * width, (i + 1) * width)),
                             True) for i in range(decodes)]  # fmt: skip
    first = decodes * width
    blocks = list(range(first, first + -(-chunk // bs)))
    return SchedulerOutput([*rows, ScheduledRequest("p", [2] * chunk, 0, blocks, True)])


def mixed_steps(model, device: torch.device, smoke: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Step time with the pieces captured (eager pieces on CPU) and fully eager."""
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.model_runner import ModelRunner

    plan, bs = SMOKE if smoke else FULL, 16
    graphs = "auto" if device.type == "cuda" else "eager"
    most = max(d for _, d in plan["cases"])
    blocks = most * (plan["context"] // bs + 1) + plan["largest"] // bs + 1
    out: dict[str, Any] = {"context": plan["context"]}
    logits: dict[tuple[str, int, int], torch.Tensor] = {}
    for label, tokens in (("pieces", plan["largest"]), ("eager", 0)):
        config = EngineConfig(num_kv_blocks=blocks, max_num_seqs=most + 1, cuda_graphs=graphs,
                              max_num_batched_tokens=plan["largest"],
                              mixed_graph_tokens=tokens)  # fmt: skip
        runner = ModelRunner(model, config, model.config.max_model_len)
        if runner.mixed is not None:
            out["pieces_sizes"] = runner.mixed.sizes
            out["pieces_capture_seconds"] = round(runner.mixed.capture_seconds, 2)
            out["pieces_capture_error"] = runner.mixed.error
        for chunk, decodes in plan["cases"]:
            sched = _mixed_sched(chunk, decodes, plan["context"], bs)
            seconds = device_time(lambda r=runner, s=sched: r.execute(s), device, plan["reps"])
            out[f"{label}_chunk{chunk}_d{decodes}_ms"] = round(seconds * 1e3, 3)
            logits[label, chunk, decodes] = runner.execute(sched).logits.float().cpu()
        del runner
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for chunk, decodes in plan["cases"]:
        key = f"chunk{chunk}_d{decodes}"
        a, b = logits["pieces", chunk, decodes], logits["eager", chunk, decodes]
        out[f"{key}_speedup"] = round(out[f"eager_{key}_ms"] / out[f"pieces_{key}_ms"], 3)
        out[f"{key}_max_abs_logit_diff"] = float((a - b).abs().max())
        out[f"{key}_argmax_equal"] = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    out["greedy"] = _greedy_both_ways(model, device, smoke)
    return out


def _greedy_both_ways(model, device: torch.device, smoke: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A chunked-prefill workload's greedy tokens with pieces and without."""
    from tide_fleet.worker.engine import SamplingParams
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.llm_engine import LLMEngine

    graphs = "auto" if device.type == "cuda" else "eager"
    vocab = model.config.vocab_size - 4
    prompts = [[(11 * i + 3 * j) % vocab + 3 for j in range(12 + 23 * i)] for i in range(8)]
    params = SamplingParams(max_tokens=8 if smoke else 24, temperature=0.0, ignore_eos=True)
    runs: dict[int, list[list[int]]] = {}
    for tokens in (64, 0):
        config = EngineConfig(num_kv_blocks=256, max_num_seqs=8, max_num_batched_tokens=64,
                              cuda_graphs=graphs, mixed_graph_tokens=tokens)  # fmt: skip
        engine = LLMEngine(model, None, config)
        runs[tokens] = [o.token_ids for o in engine.generate(prompts, params)]
        del engine
    pairs = [(a, b) for x, y in zip(runs[64], runs[0], strict=True)
             for a, b in zip(x, y, strict=True)]  # fmt: skip
    return {"equal": runs[64] == runs[0],
            "matching_tokens": round(sum(a == b for a, b in pairs) / len(pairs), 3)}  # fmt: skip
