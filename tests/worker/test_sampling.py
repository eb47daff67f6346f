"""Sampling (seeds, top-k/top-p), stop strings and incremental detokenization."""

from __future__ import annotations

import torch

from tests.conftest import make_engine
from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.kernels.sampling import cut_thresholds
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.engine.detokenizer import IncrementalDetokenizer


def top_k_top_p_mask(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """True where a token is cut."""
    return ~(logits >= cut_thresholds(logits, top_k, top_p.float()).unsqueeze(1))


def test_top_k_top_p_mask():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3))
    top_k = torch.tensor([2, 4, 4])
    top_p = torch.tensor([1.0, 0.7, 0.81])
    cut = top_k_top_p_mask(logits, top_k, top_p)
    assert cut.tolist() == [
        [False, False, True, True],  # top-2
        [False, False, True, True],  # the first two already hold 0.8 >= 0.7
        [False, False, False, True],  # 0.8 < 0.81: the third is needed too
    ]


def test_top_p_always_keeps_the_top_token():
    cut = top_k_top_p_mask(torch.tensor([[5.0, 0.0, 0.0]]), torch.tensor([3]), torch.tensor([0.01]))
    assert cut.tolist() == [[False, True, True]]


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_path):
    engine = make_engine(tiny_path)
    sp = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    alone = engine.generate([[1, 50, 60]], sp)[0].token_ids
    others = [SamplingParams(max_tokens=20, temperature=1.0) for _ in range(5)]
    batched = engine.generate([[1, 70]] * 5 + [[1, 50, 60]], [*others, sp])[-1].token_ids
    assert alone == batched
    different = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=99)
    assert engine.generate([[1, 50, 60]], different)[0].token_ids != alone


def test_top_k_one_is_greedy(tiny_path):
    engine = make_engine(tiny_path)
    greedy = engine.generate([[1, 30, 31]], SamplingParams(max_tokens=12, temperature=0.0))
    topk1 = engine.generate([[1, 30, 31]], SamplingParams(max_tokens=12, temperature=2.0, top_k=1))
    assert greedy[0].token_ids == topk1[0].token_ids


def test_stop_string_cuts_text_and_stops(stories_path, stories_refs):
    engine = make_engine(stories_path)
    ref = stories_refs[0]  # continuation: ", there was a little girl named Lily. ..."
    sp = SamplingParams(max_tokens=48, temperature=0.0, stop=["girl"])
    engine.add_request("s", ref["prompt_ids"], sp)
    deltas, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            deltas.append(out.delta_text)
            if out.finished:
                final = out
    assert final.finish_reason == "stop"
    assert final.text == ", there was a little "
    assert "".join(deltas) == final.text


def test_stop_token_ids_override_and_ignore_eos(stories_path, stories_refs):
    engine = make_engine(stories_path)
    ref = stories_refs[0]
    stop_at = ref["new_ids"][3]
    out = engine.generate(
        [ref["prompt_ids"]],
        SamplingParams(max_tokens=48, temperature=0.0, stop_token_ids=[stop_at]),
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == ref["new_ids"][:4]


def test_detok_deltas_concatenate_to_final_text_with_multibyte(tiny_path):
    tok = Tokenizer(tiny_path)
    text = "naïve café → 日本語 🎉 done"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode())  # byte-level: one token per byte
    detok = IncrementalDetokenizer(tok.decode, [1])
    deltas = []
    for t in ids:
        detok.add_token(t)
        d = detok.take_delta(final=False)
        assert "\ufffd" not in d
        deltas.append(d)
    detok.flush()
    deltas.append(detok.take_delta(final=True))
    assert "".join(deltas) == detok.text == text


def test_detok_byte_fallback_matches_full_decode(stories_path):
    tok = Tokenizer(stories_path)
    text = "Once upon a time, Ünïcode 🐶 went to the park."
    ids = tok.encode(text)
    prompt, completion = ids[:4], ids[4:]
    detok = IncrementalDetokenizer(tok.decode, prompt)
    deltas = []
    for t in completion:
        detok.add_token(t)
        deltas.append(detok.take_delta(final=False))
    detok.flush()
    deltas.append(detok.take_delta(final=True))
    full = tok.decode(ids)
    assert "".join(deltas) == detok.text == full[len(tok.decode(prompt)) :]


def test_stop_string_spanning_tokens_is_held_back(tiny_path):
    tok = Tokenizer(tiny_path)
    detok = IncrementalDetokenizer(tok.decode, [1], stop=["END"])
    emitted = ""
    for t in tok.encode("abcENDxyz", add_special_tokens=False):
        detok.add_token(t)
        emitted += detok.take_delta(final=False)
        assert "E" not in emitted
        if detok.stopped:
            break
    emitted += detok.take_delta(final=True)
    assert detok.stopped and emitted == detok.text == "abc"
