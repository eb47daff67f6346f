"""Steps with prefill run in pieces around attention at padded token counts (the CUDA-graph
path, uncaptured on CPU): the tokens of unpadded steps, padding rows write no KV, and steps
past the largest size stay eager."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_engine
from tests.worker.test_batching import _workload
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import dispatch
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.mixed_graphs import MixedGraphs, token_sizes
from tide_fleet.worker.engine.scheduler import ScheduledRequest
from tide_fleet.worker.engine.step_inputs import StepBuilder

needs_cpp = pytest.mark.skipif(cpu_kernels.ops() is None, reason="native CPU kernels not built")


def test_token_sizes_pad_at_most_half_and_end_at_the_largest():
    assert token_sizes(512) == [16, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    assert token_sizes(100) == [16, 32, 48, 64, 96, 100]
    assert token_sizes(48) == [16, 32, 48]
    assert token_sizes(5) == [5]
    for n in range(17, 513):
        size = next(s for s in token_sizes(512) if s >= n)
        assert size - n < n  # fewer padding rows than real ones


def test_a_negative_size_is_refused_by_name():
    with pytest.raises(ValueError, match="mixed_graph_tokens must be at least 0"):
        EngineConfig(mixed_graph_tokens=-1)


@pytest.fixture
def mixed_steps(monkeypatch):
    """(tokens, padded size) of every step the pieces ran."""
    seen: list[tuple[int, int]] = []
    run = MixedGraphs.run

    def spy(self, scheduled, feed=None):
        n = sum(s.num_tokens for s in scheduled)
        seen.append((n, next(s for s in self.sizes if s >= n)))
        return run(self, scheduled, feed)

    monkeypatch.setattr(MixedGraphs, "run", spy)
    return seen


@needs_cpp
@pytest.mark.parametrize("mirror", [False, True], ids=["shared-buffers", "copied-buffers"])
def test_padded_steps_with_prefill_change_no_token(tiny_path, mixed_steps, monkeypatch, mirror):
    # mirror: separate "device" buffers on CPU, so every copy a GPU step makes is made here.
    monkeypatch.setattr(StepBuilder, "mirror_on_cpu", mirror)
    prompts, params = _workload(2, 16)
    plain = make_engine(tiny_path, cuda_graphs="off", max_num_seqs=8)
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    # Chunked prefill beside decode rows, prefix hits and preemption.
    engine = make_engine(
        tiny_path, cuda_graphs="eager", max_num_seqs=8, num_kv_blocks=30,
        max_num_batched_tokens=64,
    )  # fmt: skip
    mixed = engine.runner.mixed
    assert mixed is not None and not mixed.graphs and mixed.sizes == [16, 32, 48, 64]
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    assert engine.stats()["num_preemptions"] > 0 and engine.stats()["prefix_cache_hits"] > 0
    assert any(n < size for n, size in mixed_steps), "no step was padded"
    assert any(n > 16 for n, _ in mixed_steps)
    engine.block_manager.assert_all_free()


@needs_cpp
def test_steps_past_the_largest_size_run_eagerly(tiny_path, mixed_steps):
    prompts = [[1, *range(10, 80)], [1, *range(90, 100)]]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in make_engine(tiny_path).generate(prompts, params)]
    engine = make_engine(tiny_path, cuda_graphs="eager", mixed_graph_tokens=32)
    assert engine.runner.mixed is not None and engine.runner.mixed.sizes == [16, 32]
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    assert not mixed_steps, "an 82-token step ran in pieces sized for 32"
    off = make_engine(tiny_path, cuda_graphs="eager", mixed_graph_tokens=0)
    assert off.runner.mixed is None and off.runner.graphs is not None


@needs_cpp
def test_padding_rows_write_no_kv_and_their_output_is_dropped(tiny_path):
    engine = make_engine(tiny_path, cuda_graphs="eager", num_kv_blocks=8)
    mixed = engine.runner.mixed
    assert mixed is not None
    before = [k.clone() for k, _ in engine.runner.kv_caches]
    logits, ids = mixed.run([ScheduledRequest("a", list(range(5, 22)), 0, [2, 3], True)])
    assert ids == ["a"] and logits.shape[0] == 1 and torch.isfinite(logits).all()
    for k, b in zip((k for k, _ in engine.runner.kv_caches), before, strict=True):
        changed = (k != b).any(dim=(0, 3))  # [blocks, block_size]: slots written
        assert changed[2].all() and changed[3, :1].all()  # the 17 real tokens' slots
        assert not changed[3, 1:].any() and not changed[[0, 1, 4, 5, 6, 7]].any()


@pytest.fixture
def forced(monkeypatch):  # type: ignore[no-untyped-def]
    def force(value: str) -> None:
        monkeypatch.setenv(dispatch.FORCE_VAR, value)
        dispatch.refresh()

    yield force
    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()


@pytest.mark.skipif(
    not hasattr(torch, "compile") or __import__("os").environ.get("TRITON_INTERPRET") != "1",
    reason="runs the Triton kernels in Triton's interpreter",
)
def test_the_cuda_kernels_in_pieces_keep_the_tokens(tiny_path, forced, mixed_steps):
    """What CUDA runs, on the CPU: Triton attention (written into the pieces' buffer) and
    the fused elementwise kernels, the model's own loop; pieces equal whole steps."""
    pytest.importorskip("triton")
    forced("norm=triton,rope=triton,activation=triton")
    prompts = [[1, 40, 41, 42, 7], [1, *range(60, 90)]]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    def run(graphs: str) -> list[list[int]]:
        engine = make_engine(tiny_path, attention_backend="triton", cuda_graphs=graphs,
                             num_kv_blocks=32, max_num_batched_tokens=24)  # fmt: skip
        engine.runner.model.native = None  # the loop CUDA runs
        return [o.token_ids for o in engine.generate(prompts, params)]

    assert run("eager") == run("off")
    assert any(n < size for n, size in mixed_steps)


@needs_cpp
def test_a_capture_that_fails_leaves_those_steps_eager(
    tiny_path, caplog, mixed_steps, monkeypatch
):  # fmt: skip
    engine = make_engine(tiny_path, cuda_graphs="eager", num_kv_blocks=16)
    runner = engine.runner

    def fails(self: MixedGraphs) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(MixedGraphs, "_capture", fails)
    with caplog.at_level("WARNING"):
        pieces = MixedGraphs(runner.model, runner.kv_caches, runner.builder, 32, capture=True)
    assert pieces.error == "RuntimeError: operation not permitted when stream is capturing"
    assert "could not be captured" in caplog.text
    step = [ScheduledRequest("a", list(range(5, 22)), 0, [2, 3], True)]
    assert not pieces.fits(step) and not pieces.graphs
    runner.mixed = pieces
    prompts = [[1, *range(10, 40)]]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in make_engine(tiny_path).generate(prompts, params)]
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    assert not mixed_steps  # the prompt ran eagerly
