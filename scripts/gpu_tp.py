"""gpu_check.py's tensor-parallel section: the engine at tensor_parallel_size 1 through the
distributed path (NCCL on a GPU, gloo on CPU) against the same weights without it: greedy
tokens equal, and the decode step time side by side; on a GPU also a CUDA graph that
captures an NCCL all-reduce and replays it. Multi-GPU speed needs several GPUs; the
planner gives its expected all-reduce cost (``tide plan --tensor-parallel-size N``)."""

from __future__ import annotations

import statistics
from typing import Any

import torch
from gpu_decode import _decode_sched, _step_times

STEP = dict(batch=64, context=512, reps=20)
SMOKE_STEP = dict(batch=4, context=32, reps=3)


def one_rank(model, device: torch.device, smoke: bool) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from tide_fleet.worker.engine import SamplingParams
    from tide_fleet.worker.engine.config import EngineConfig
    from tide_fleet.worker.engine.llm_engine import LLMEngine
    from tide_fleet.worker.engine.model_runner import ModelRunner
    from tide_fleet.worker.models.llama import LlamaModel
    from tide_fleet.worker.parallel.group import TensorParallel, free_address

    tp = TensorParallel.join(0, 1, free_address(), device)
    out: dict[str, Any] = {"backend": "nccl" if device.type == "cuda" else "gloo"}
    try:
        # Rank 0 of 1 holds every weight: the same tensors, the distributed model path.
        ranked = LlamaModel(model.config, model.embed, model.layers, model.norm,
                            model.lm_head, tp)  # fmt: skip
        graphs = "auto" if device.type == "cuda" else "eager"
        prompts = [[(5 * i + j) % 200 + 3 for j in range(24 + 8 * i)] for i in range(4)]
        params = SamplingParams(max_tokens=8 if smoke else 32, temperature=0.0, ignore_eos=True)
        tokens = []
        for m in (model, ranked):
            engine = LLMEngine(m, None, EngineConfig(num_kv_blocks=64, cuda_graphs=graphs))
            tokens.append([o.token_ids for o in engine.generate(prompts, params)])
            del engine
        out["greedy_equal"] = tokens[0] == tokens[1]
        plan = SMOKE_STEP if smoke else STEP
        bs, batch, context = 16, plan["batch"], plan["context"]
        config = EngineConfig(num_kv_blocks=batch * (context // bs + 1), max_num_seqs=batch,
                              cuda_graphs=graphs)  # fmt: skip
        runners = [ModelRunner(m, config, model.config.max_model_len) for m in (model, ranked)]
        sched = _decode_sched(batch, context, bs)
        times: list[list[float]] = [[], []]
        for _ in range(3):  # alternated, so drift affects both alike
            for i, runner in enumerate(runners):
                times[i].append(_step_times(runner, sched, device, plan["reps"])["steady_ms"])
        plain, ranked_ms = (statistics.median(t) for t in times)
        out.update({
            "step": f"decode batch {batch}, context {context}, cuda_graphs {graphs}",
            "plain_step_ms": round(plain, 3), "tp1_step_ms": round(ranked_ms, 3),
            "ratio": round(ranked_ms / plain, 4), "within_2pct": ranked_ms <= plain * 1.02,
        })  # fmt: skip
        del runners
        if device.type == "cuda":
            out["graph_captured_all_reduce"] = _graph_all_reduce(device)
    finally:
        tp.close()
    return out


def _graph_all_reduce(device: torch.device) -> dict[str, Any]:
    """An NCCL all-reduce captured in a CUDA graph and replayed (the collectives of a
    tensor-parallel decode step are captured the same way)."""
    import torch.distributed as dist

    x = torch.full((4096,), 3.0, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(x)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
    x.fill_(5.0)
    graph.replay()
    torch.cuda.synchronize(device)
    return {"replayed": True, "sum_of_one_rank_unchanged": bool((x == 5.0).all())}
