"""Decode-only steps on padded, static buffers (the CUDA-graph path, run eagerly on CPU) give
the tokens of unpadded steps; the persistent step buffers and block tables, copied as on a
GPU, change nothing."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_engine
from tests.worker.test_batching import _workload
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.worker.engine.decode_graphs import DecodeGraphs, capture_sizes, graph_mode
from tide_fleet.worker.engine.step_inputs import StepBuilder

needs_cpp = pytest.mark.skipif(cpu_kernels.ops() is None, reason="native CPU kernels not built")


def test_capture_sizes_cover_every_batch_up_to_the_largest():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert capture_sizes(100) == [1, 2, 4, 8, 16, 32, 64, 96, 100]
    assert capture_sizes(1) == [1]
    assert capture_sizes(12) == [1, 2, 4, 8, 12]


def test_graph_mode_per_device_and_backend():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert graph_mode("auto", cuda, one_decode_group=True) == "cuda"
    assert graph_mode("auto", cpu, one_decode_group=True) == "off"
    assert graph_mode("auto", cuda, one_decode_group=False) == "off"
    assert graph_mode("eager", cpu, one_decode_group=True) == "eager"
    assert graph_mode("off", cuda, one_decode_group=True) == "off"
    with pytest.raises(ValueError, match="torch reference"):
        graph_mode("eager", cpu, one_decode_group=False)
    with pytest.raises(ValueError, match="cuda_graphs"):
        graph_mode("always", cpu, one_decode_group=True)


@pytest.fixture
def padded_sizes(monkeypatch):
    """(rows, padded size) of every padded decode step run."""
    seen: list[tuple[int, int]] = []
    run = DecodeGraphs.run

    def spy(self, scheduled, feed=None):
        seen.append((len(scheduled), next(s for s in self.sizes if s >= len(scheduled))))
        return run(self, scheduled, feed)

    monkeypatch.setattr(DecodeGraphs, "run", spy)
    return seen


@needs_cpp
@pytest.mark.parametrize("mirror", [False, True], ids=["shared-buffers", "copied-buffers"])
def test_padded_decode_steps_change_no_token(tiny_path, padded_sizes, monkeypatch, mirror):
    # mirror: separate "device" buffers on CPU, so every host-to-device copy a GPU step
    # makes is made here too (a missed copy reads stale inputs and changes tokens).
    monkeypatch.setattr(StepBuilder, "mirror_on_cpu", mirror)
    prompts, params = _workload(1, 20)
    plain = make_engine(tiny_path, cuda_graphs="off", max_num_seqs=12)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    # A small pool and step budget: chunked prefill, prefix hits and preemption as well.
    engine = make_engine(
        tiny_path, cuda_graphs="eager", max_num_seqs=12, num_kv_blocks=30,
        max_num_batched_tokens=48,
    )  # fmt: skip
    assert engine.runner.graphs is not None and not engine.runner.graphs.graphs
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    assert engine.stats()["num_preemptions"] > 0 and engine.stats()["prefix_cache_hits"] > 0
    assert any(n < size for n, size in padded_sizes), "no step was padded"
    assert {size for _, size in padded_sizes} <= set(capture_sizes(12))
    engine.block_manager.assert_all_free()


@needs_cpp
def test_padding_rows_write_no_kv(tiny_path):
    engine = make_engine(tiny_path, cuda_graphs="eager", max_num_seqs=8)
    before = [k.clone() for k, _ in engine.runner.kv_caches]
    graphs = engine.runner.graphs
    assert graphs is not None
    graphs.builder.write_padded_decodes([], 8)  # eight padding rows, nothing real
    logits = graphs._forward(8)
    assert torch.isfinite(logits).all()
    for k, b in zip((k for k, _ in engine.runner.kv_caches), before, strict=True):
        assert torch.equal(k, b), "a padding row wrote into the KV cache"


def test_the_torch_reference_refuses_eager_graphs(tiny_path):
    with pytest.raises(ValueError, match="torch reference"):
        make_engine(tiny_path, cuda_graphs="eager", attention_backend="torch")


@needs_cpp
def test_rows_that_sample_nothing_are_left_out_of_the_logits(tiny_path):
    # A prefill chunk cut to one token by the step budget looks like a decode row but has
    # no next token yet: the padded step drops its logits row.
    from tide_fleet.worker.engine.scheduler import ScheduledRequest

    graphs = make_engine(tiny_path, cuda_graphs="eager", max_num_seqs=4).runner.graphs
    assert graphs is not None
    alone, ids = graphs.run([ScheduledRequest("a", [5], 3, [0], True)])
    assert ids == ["a"]
    both, ids = graphs.run(
        [ScheduledRequest("a", [5], 3, [0], True), ScheduledRequest("b", [6], 3, [1], False)]
    )
    assert ids == ["a"] and both.shape == alone.shape
    torch.testing.assert_close(both, alone, atol=1e-4, rtol=1e-4)
