"""ModelRunner.profile_run (the largest steps, run at load on CPU and before sizing the KV pool
on CUDA) on models whose context is shorter than a step's token budget: it once built one
prompt of max_num_batched_tokens tokens and ran it past the model's positions ("rotary_:
position 512 outside 0..511" on stories260K); now the step's prefill is split into prompts
that fit, and the step keeps at most max_num_seqs requests."""

from __future__ import annotations

import pytest

from tide_fleet.worker.engine import LLMEngine, SamplingParams


@pytest.mark.parametrize(
    ("batched", "seqs", "max_model_len"),
    [(1024, 64, None), (2048, 64, None), (2048, 2, 64), (100, 8, 100)],
)
def test_profile_steps_fit_the_context_and_the_rows(stories_path, batched, seqs, max_model_len):
    """stories260K's context is 512 positions: every case asks for longer steps than that,
    or for more prompts than rows."""
    engine = LLMEngine.from_pretrained(
        str(stories_path), device="cpu", max_model_len=max_model_len,
        max_num_batched_tokens=batched, max_num_seqs=seqs, num_kv_blocks=64,
    )  # fmt: skip
    engine.runner.profile_run()  # also ran at load on CPU; explicit here
    out = engine.generate([[1, 5, 6]], SamplingParams(max_tokens=3, temperature=0.0))
    assert len(out[0].token_ids) == 3
