"""Tokenizer.token_bytes: the raw bytes of one token, for SentencePiece with byte fallback
(stories260K), the dummy models' byte-level tokenizer, and a byte-level BPE with merges."""

from __future__ import annotations

from pathlib import Path

import llguidance
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from tide_fleet.infra.contract.tokenizer import Tokenizer, byte_level_alphabet

TEXTS = ["Once upon a time, the dog went to the park.", "naïve café → 日本語 🎉", "a\n\tb  c"]


def _every_token_agrees_with_llguidance(tok: Tokenizer) -> None:
    reference = llguidance.LLTokenizer(tok.to_json(), eos_token=2)
    for i in range(tok.vocab_size):
        ours, theirs = tok.token_bytes(i), reference.decode_bytes([i])
        if theirs == b"" and ours == b"\xff":
            continue  # llguidance keeps byte 0xFF for itself (its special-token marker)
        assert ours == theirs, (i, ours, theirs)


def test_sentencepiece_byte_fallback(stories_path: Path):
    tok = Tokenizer(stories_path)
    vocab = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    assert tok.token_bytes(tok._tok.token_to_id("<0x0A>")) == b"\n"
    assert tok.token_bytes(tok._tok.token_to_id("<0xFF>")) == b"\xff"
    assert tok.token_bytes(tok._tok.token_to_id("▁the")) == b" the"  # "▁" is a space
    assert tok.token_bytes(2) == b"</s>"  # a special token is its content
    assert tok.token_bytes(10_000) == b""  # outside the vocabulary
    assert b" the" in vocab and b"he" in vocab
    _every_token_agrees_with_llguidance(tok)


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_tokens_join_to_the_text(stories_path: Path, text: str):
    tok = Tokenizer(stories_path)
    ids = tok.encode(text, add_special_tokens=False)
    # Metaspace prepends "▁" to the first word: mid-text, every token keeps its space.
    assert b"".join(tok.token_bytes(i) for i in ids) == (" " + text).encode()


def test_dummy_byte_level_tokens_are_their_bytes(tiny_path: Path):
    tok = Tokenizer(tiny_path)
    assert [tok.token_bytes(4 + b) for b in range(256)] == [bytes([b]) for b in range(256)]
    assert tok.token_bytes(1) == b"<s>"
    _every_token_agrees_with_llguidance(tok)


def _trained_byte_level_bpe(folder: Path) -> Tokenizer:
    """A GPT-2-style tokenizer (byte-level pre-tokenizer and decoder, merges) trained here."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    hf.train_from_iterator(TEXTS * 20 + ["the theory of the thing " * 10], trainer)
    folder.mkdir()
    hf.save(str(folder / "tokenizer.json"))
    return Tokenizer(folder)


@pytest.mark.parametrize("text", [*TEXTS, "the thing 日本"])
def test_byte_level_bpe_with_merges(tmp_path: Path, text: str):
    tok = _trained_byte_level_bpe(tmp_path / "bpe")
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) < len(text.encode())  # merges: some tokens are several bytes
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    the = tok._tok.token_to_id("Ġthe")
    assert the is not None and tok.token_bytes(the) == b" the"
    assert tok.token_bytes(tok._tok.token_to_id("<|endoftext|>")) == b"<|endoftext|>"
    _every_token_agrees_with_llguidance(tok)


def test_the_byte_alphabet_is_a_bijection():
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == ord(" ") and alphabet["!"] == ord("!")
    assert set(alphabet) == set(pre_tokenizers.ByteLevel.alphabet())
