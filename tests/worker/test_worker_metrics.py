"""Worker metrics: the FLOP/byte arithmetic on fixed inputs, peaks, and real engine steps."""

from __future__ import annotations

import math

import httpx
import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from tests.conftest import make_engine
from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.plan.roofline import DevicePeaks, ModelCost, utilisation
from tide_fleet.infra.settings import Settings
from tide_fleet.worker.device_peaks import device_peaks, measure_peaks
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.engine.llm_engine import StepStats
from tide_fleet.worker.metrics import WorkerMetrics, ema, model_label

# hidden 8, 2 heads of 4 (q = 8), 1 KV head (kv = 4), MLP 16, 2 layers, vocab 10.
CFG = ModelConfig("LlamaForCausalLM", vocab_size=10, hidden_size=8, intermediate_size=16,
                  num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                  max_position_embeddings=64)  # fmt: skip
LABELS = {"pool": "test"}  # the model label is the folder name of dummy:tiny


def test_step_stats_count_context_per_token():
    step = StepStats()
    step.add(1, 10, num_prompt_tokens=5)  # a decode at position 10 reads 11 positions
    step.add(4, 0, num_prompt_tokens=4)  # a fresh 4-token chunk: 1 + 2 + 3 + 4
    step.add(3, 5, num_prompt_tokens=8)  # a chunk after 5 cached tokens: 6 + 7 + 8
    assert (step.num_seqs, step.num_tokens, step.num_decode_tokens) == (3, 8, 1)
    assert step.kv_tokens_read == 11 + 4 + 8
    assert step.attn_context_sum == 11 + 10 + 21
    assert step.kind == "mixed"
    assert StepStats(num_decode_tokens=2).kind == "decode"
    assert StepStats(num_prefill_tokens=2).kind == "prefill"


def test_model_cost_from_shapes():
    cost = ModelCost.from_config(CFG, dtype_bytes=2)
    # per layer: qkv 8 x (8 + 2 x 4) + o 8 x 8 + gate/up/down 3 x 8 x 16 = 128 + 64 + 384
    assert cost.linear_params == 2 * 576 and cost.head_params == 10 * 8
    # Matmul weights + input embedding + 2 norms per layer + final norm = every parameter.
    assert cost.linear_params + cost.head_params + 10 * 8 + 2 * 2 * 8 + 8 == CFG.num_parameters()
    # 3 tokens, 2 sampled rows, 42 attended positions:
    # 2 x (1152 x 3 + 80 x 2) + 4 x 2 layers x 2 heads x 4 dims x 42 = 7232 + 2688
    assert cost.flops(3, 2, 42) == 7232 + 2688
    # (1152 + 80) weights x 2 bytes, KV 2 x 2 layers x 1 head x 4 dims x 2 bytes = 32 per token
    assert cost.weight_bytes == 2464 and cost.kv_bytes_per_token == 32
    assert cost.bytes_moved(kv_tokens_read=11, kv_tokens_written=3) == 2464 + 32 * 14


def test_utilisation_and_time_weighted_ema():
    peaks = DevicePeaks(flops=1e12, bandwidth=1e11, source="test")
    assert utilisation(5e9, 5e8, 0.01, peaks) == pytest.approx((0.5, 0.5))
    assert utilisation(5e9, 5e8, 0.0, peaks) == (0.0, 0.0)
    assert ema(None, 0.7, 0.01) == 0.7
    assert ema(0.0, 1.0, dt=5.0 * math.log(2), tau=5.0) == pytest.approx(0.5)
    assert ema(0.2, 1.0, dt=0.001) == pytest.approx(0.2, abs=1e-3)  # a short step moves it little


def test_peaks_from_the_table_and_overrides():
    h200 = device_peaks("cuda:0", "bfloat16", Settings(worker_device="h200"))
    assert (h200.flops, h200.bandwidth, h200.source) == (989e12, 4800e9, "table:h200")
    assert device_peaks("cuda:0", "float32", Settings(worker_device="H200")).flops == 67e12
    mixed = device_peaks("cpu", "bfloat16", Settings(worker_device="h200", worker_peak_flops=1e12))
    assert (mixed.flops, mixed.bandwidth, mixed.source) == (1e12, 4800e9, "override")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        device_peaks("cpu", "float32", Settings(worker_device="tpu"))
    with pytest.raises(ValidationError, match="worker_peak_flops"):
        Settings(worker_peak_flops=-1)
    with pytest.raises(ValidationError, match="worker_metrics_port"):
        Settings(worker_metrics_port=70000)


def test_cpu_peaks_are_measured_quickly():
    peaks = measure_peaks("cpu", "float32")
    assert peaks.source == "measured"
    assert 1e9 < peaks.flops < 1e14 and 1e9 < peaks.bandwidth < 1e13


def test_model_label_is_short():
    assert model_label("dummy:tiny") == "dummy:tiny"
    assert model_label("/models/llama-3-8b") == "llama-3-8b"


@pytest.fixture(scope="module")
def engine(tiny_path):
    return make_engine(tiny_path, max_num_seqs=4, num_kv_blocks=6)


def scrape(metrics: WorkerMetrics) -> Scrape:
    return Scrape.parse(generate_latest(metrics.registry).decode())


def test_metrics_move_with_real_engine_steps(engine):
    settings = Settings(worker_peak_flops=1e10, worker_peak_bandwidth=1e9)
    metrics = WorkerMetrics.for_engine(engine, "test", settings)
    steps: list[StepStats] = []
    hook = engine.on_step
    engine.on_step = lambda step, outs: (steps.append(step) if step else None, hook(step, outs))
    assert scrape(metrics).total("tide:engine_max_num_seqs", **LABELS) == 4
    prompt = engine.tokenizer.encode("a shared prefix that fills more than one block " * 2)
    # Three 40-token requests on a 6-block (96-token) pool: they cannot all fit: preemption.
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    outs = engine.generate([prompt[:20], prompt[:20], prompt[:24]], params)
    s = scrape(metrics)

    stats = engine.stats()
    assert s.total("tide:generation_tokens_total", **LABELS) == stats["generation_tokens"] == 120
    assert s.total("tide:prompt_tokens_total", **LABELS) == stats["prompt_tokens"] > 0
    assert s.total("tide:num_preemptions_total", **LABELS) == stats["num_preemptions"] > 0
    assert s.total("tide:prefix_cache_queries_total", **LABELS) == stats["prefix_cache_queries"]
    assert s.total("tide:prefix_cache_hits_total", **LABELS) == stats["prefix_cache_hits"]
    assert s.total("tide:num_requests_running", **LABELS) == 0
    assert s.total("tide:kv_cache_usage_perc", **LABELS) == stats["kv_cache_usage"]

    assert s.total("tide:iteration_tokens_total_count", **LABELS) == len(steps)
    assert s.total("tide:iteration_tokens_total_sum", **LABELS) == sum(x.num_tokens for x in steps)
    kinds = s.by_label("tide:step_time_seconds_count", "kind")
    assert kinds["decode"] > 0 and kinds["prefill"] > 0 and sum(kinds.values()) == len(steps)
    step_seconds = sum(s.by_label("tide:step_time_seconds_sum", "kind").values())
    assert step_seconds == pytest.approx(sum(x.duration_s for x in steps))

    cost = metrics.cost
    flops = sum(cost.flops(x.num_tokens, x.num_sampled, x.attn_context_sum) for x in steps)
    assert s.total("tide:estimated_flops_total", **LABELS) == pytest.approx(flops)
    last = steps[-1]
    mfu, mbu = utilisation(
        cost.flops(last.num_tokens, last.num_sampled, last.attn_context_sum),
        cost.bytes_moved(last.kv_tokens_read, last.num_tokens), last.duration_s, metrics.peaks,
    )  # fmt: skip
    assert s.total("tide:mfu", **LABELS) == pytest.approx(mfu) and mfu > 0
    assert s.total("tide:mbu", **LABELS) == pytest.approx(mbu) and mbu > 0
    assert s.total("tide:mfu_ema", **LABELS) > 0 and s.total("tide:mbu_ema", **LABELS) > 0

    n = len(outs)
    assert s.total("tide:time_to_first_token_seconds_count", **LABELS) == n
    assert s.total("tide:e2e_request_latency_seconds_count", **LABELS) == n
    assert s.total("tide:inter_token_latency_seconds_count", **LABELS) == 120 - n
    assert s.total("tide:request_success_total", finished_reason="length") == n
    assert not metrics._last_token  # nothing left behind


def test_queue_time_counts_from_job_creation(engine):
    metrics = WorkerMetrics.for_engine(engine, "test", Settings(worker_device="h200"))
    ids = engine.tokenizer.encode("hello")
    engine.add_request("job-1", ids, SamplingParams(max_tokens=2))
    created = engine.requests["job-1"].timings.arrival - 7.0  # waited 7 s in Redis
    metrics.track("job-1", created)
    while engine.has_unfinished():
        engine.step()
    s = scrape(metrics)
    assert 7.0 <= s.total("tide:request_queue_time_seconds_sum", **LABELS) < 9.0
    assert 7.0 <= s.total("tide:e2e_request_latency_seconds_sum", **LABELS) < 9.0
    assert s.total("tide:time_to_first_token_seconds_sum", **LABELS) < 2.0  # engine-side only


def test_endpoint_serves_the_registry(engine):
    metrics = WorkerMetrics.for_engine(engine, "test", Settings(worker_device="h200"))
    url = metrics.serve("127.0.0.1", 0)
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        engine.generate(
            [engine.tokenizer.encode("hi")],
            SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),  # exactly 3
        )
        s = Scrape.parse(httpx.get(url, timeout=5).text)
        assert s.total("tide:generation_tokens_total", **LABELS) == 3
        assert s.total("tide:device_peak_flops", **LABELS) == 67e12  # float32: no tensor cores
        assert s.total("process_cpu_seconds_total") is not None
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(OSError, match="worker_metrics_port"):
            metrics.serve("127.0.0.1", port)  # taken
    finally:
        metrics.close()
