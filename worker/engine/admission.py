"""Whether a request can ever run on an engine, and the token ids that stop it.

Torch-free: the rules ``LLMEngine.validate`` and ``add_request`` apply before a request
reaches the scheduler. Each refusal is a ValueError that names the numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

from tide_fleet.infra.contract.sampling_params import SamplingParams


def check_request(
    num_prompt_tokens: int,
    params: SamplingParams,
    *,
    max_model_len: int,
    kv_capacity_tokens: int,
    vocab_size: int,
    has_grammar: bool,
) -> None:
    """Raise ValueError naming the numbers when a request can never run on this engine."""
    if num_prompt_tokens < 1:
        raise ValueError("prompt is empty: at least one token is required")
    total = num_prompt_tokens + params.max_tokens
    if num_prompt_tokens >= max_model_len:
        raise ValueError(
            f"prompt has {num_prompt_tokens} tokens but the model's context is "
            f"{max_model_len} tokens"
        )
    if total > max_model_len:
        raise ValueError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({params.max_tokens}) = "
            f"{total} exceeds the model's context of {max_model_len} tokens"
        )
    if total > kv_capacity_tokens:
        raise ValueError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({params.max_tokens}) = "
            f"{total} exceeds the KV cache capacity of {kv_capacity_tokens} tokens"
        )
    bad = next((t for t in params.logit_bias or () if t >= vocab_size), None)
    if bad is not None:
        raise ValueError(f"logit_bias token id {bad} is outside the vocabulary [0, {vocab_size})")
    if params.structured is not None and not has_grammar:
        raise ValueError("structured output needs the model's tokenizer")


def check_prompt_ids(prompt_token_ids: Iterable[int], vocab_size: int) -> None:
    """Raise ValueError for the first prompt token id outside the vocabulary."""
    bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")


def stop_token_ids(params: SamplingParams, eos_token_ids: set[int]) -> frozenset[int]:
    """The request's own stop_token_ids, or the model's EOS ids; ignore_eos drops the EOS ids."""
    explicit = params.stop_token_ids
    stops = set(explicit) if explicit is not None else set(eos_token_ids)
    return frozenset(stops - eos_token_ids if params.ignore_eos else stops)
