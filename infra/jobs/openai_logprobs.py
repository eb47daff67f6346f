"""Logprobs in OpenAI's two shapes, from the worker's entries (the wire contract): one per
generated token, ``{token, bytes, logprob, top_logprobs: [{token, bytes, logprob}]}``."""

from __future__ import annotations

from typing import Any


def completion_logprobs(entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """Completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``. Offsets count
    characters into the choice's text (from `offset`, where a stream's chunk starts): the
    running length of the token strings."""
    offsets, pos = [], offset
    for e in entries:
        offsets.append(pos)
        pos += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Chat's ``{content: [entries], refusal: null}``: the worker's entries as they are."""
    return {
        "content": [
            {"token": e["token"], "bytes": e.get("bytes"), "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "bytes": t.get("bytes"),
                               "logprob": t["logprob"]} for t in e["top_logprobs"]]}
            for e in entries
        ],
        "refusal": None,
    }  # fmt: skip
