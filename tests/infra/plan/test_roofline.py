"""One roofline for its three users: the worker's MFU/MBU, the planner and the simulator
agree on one shape (the worker leaves out norm weights, and says so)."""

from __future__ import annotations

import pytest

from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.infra.fleet.fleet_config import PoolConfig
from tide_fleet.infra.plan.devices import get_device
from tide_fleet.infra.plan.model_shape import ModelShape, projection_parameters
from tide_fleet.infra.plan.planner import estimate_decode_tokens_per_s
from tide_fleet.infra.plan.roofline import (
    DevicePeaks,
    ModelCost,
    decode_step_seconds,
    run_roofline_seconds,
    utilisation,
)
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.sim.service_model import EFFICIENCY, roofline_model
from tide_fleet.worker.device_peaks import device_peaks

SHAPE = ModelShape.from_preset("llama-3-8b")
# The same model as the engine reads it from config.json.
CONFIG = ModelConfig("LlamaForCausalLM", vocab_size=128256, hidden_size=4096,
                     intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                     head_dim=128, max_position_embeddings=8192)  # fmt: skip
H200 = get_device("h200")
BATCH, CONTEXT = 8, 1000


def test_worker_and_planner_costs_differ_only_by_the_norm_weights():
    worker = ModelCost.from_config(CONFIG, dtype_bytes=2)
    planner = ModelCost.from_shape(SHAPE, "bfloat16", "bfloat16")
    assert worker.linear_params == projection_parameters(SHAPE)
    norms = SHAPE.num_layers * 2 * SHAPE.hidden_size + SHAPE.hidden_size  # no biases here
    assert planner.linear_params - worker.linear_params == norms
    same = ("head_params", "num_layers", "num_heads", "head_dim", "dtype_bytes")
    assert all(getattr(worker, f) == getattr(planner, f) for f in same)
    assert (
        worker.kv_bytes_per_token
        == planner.kv_bytes_per_token
        == SHAPE.kv_bytes_per_token("bfloat16")
    )
    positions = BATCH * CONTEXT  # a decode step: every row samples
    assert planner.flops(BATCH, BATCH, positions) - worker.flops(BATCH, BATCH, positions) == (
        2 * norms * BATCH
    )
    assert planner.bytes_moved(positions, 0) - worker.bytes_moved(positions, 0) == 2 * norms


def test_planner_and_simulator_share_the_decode_step():
    cost = ModelCost.from_shape(SHAPE, "bfloat16", "bfloat16")
    peaks = DevicePeaks.from_spec(H200, "bfloat16")
    mem_s, compute_s = decode_step_seconds(SHAPE, H200, BATCH, CONTEXT, "bfloat16", "bfloat16")
    positions = BATCH * CONTEXT
    assert mem_s == cost.bytes_moved(positions, 0) / peaks.bandwidth
    assert compute_s == cost.flops(BATCH, BATCH, positions) / peaks.flops
    rate = estimate_decode_tokens_per_s(SHAPE, H200, BATCH, CONTEXT, efficiency=EFFICIENCY)
    assert rate == pytest.approx(EFFICIENCY * BATCH / max(mem_s, compute_s))
    # The simulator's worker, full of BATCH jobs at CONTEXT, steps at the same roofline.
    sim = roofline_model(PoolConfig(name="p", buckets=["short"], device="h200", model="llama-3-8b"))
    mem = BATCH * sim.mem_s_per_ctx * CONTEXT
    flop = BATCH * (sim.flop_s_per_seq + sim.flop_s_per_ctx * CONTEXT)
    assert sim.step_time(mem, flop, 0.0) == pytest.approx(max(mem_s, compute_s) / EFFICIENCY)


def test_worker_peaks_and_utilisation_use_the_same_table():
    worker = device_peaks("cuda:0", "bfloat16", Settings(worker_device="h200"))
    assert worker == DevicePeaks.from_spec(H200, "bfloat16")
    cost = ModelCost.from_config(CONFIG, dtype_bytes=2)
    flops, nbytes = cost.flops(BATCH, BATCH, BATCH * CONTEXT), cost.bytes_moved(BATCH * CONTEXT, 0)
    mem_s, compute_s = worker.seconds(flops, nbytes)
    # A step that ran exactly at the roofline uses the bound resource fully.
    mfu, mbu = utilisation(flops, nbytes, max(mem_s, compute_s), worker)
    assert max(mfu, mbu) == pytest.approx(1.0) and min(mfu, mbu) < 1.0


def test_a_run_roofline_reads_weights_per_decode_step_and_prices_prefill_at_the_peak():
    cost = ModelCost.from_config(CONFIG, dtype_bytes=2)
    peaks = DevicePeaks(flops=1e12, bandwidth=20e9, source="measured")
    read = cost.weight_bytes / peaks.bandwidth
    prefill = 2.0 * cost.linear_params / peaks.flops  # one prompt token
    steps = [(0, 512), (4, 100), (64, 0), (1, 0)]  # prefill only, mixed, two decode steps
    got = run_roofline_seconds(cost, steps, peaks)
    assert got == pytest.approx(3 * read + 612 * prefill)
    assert run_roofline_seconds(cost, [], peaks) == 0.0
    with pytest.raises(ValueError, match="-1 decode rows"):
        run_roofline_seconds(cost, [(-1, 0)], peaks)
