"""Tokenizer from ``tokenizer.json`` plus the generation and tokenizer configs beside it.

Torch-free, so the gateway can count tokens with exactly what the workers use, and
render logprobs (``token_bytes``) with exactly what the workers sampled.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from tide_fleet.infra.contract.model_config import ModelLoadError


class Tokenizer:
    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"missing file: {path}")
        self._tok = HFTokenizer.from_file(str(path))
        self.config: dict[str, Any] = _read_json(folder / "tokenizer_config.json")
        generation = _read_json(folder / "generation_config.json")
        model = _read_json(folder / "config.json")
        self.bos_token_id = _token_id(self, self.config.get("bos_token"), model.get("bos_token_id"))
        eos = generation.get("eos_token_id", model.get("eos_token_id"))
        self.eos_token_ids: list[int] = [eos] if isinstance(eos, int) else list(eos or [])
        self.add_bos = bool(self.config.get("add_bos_token", self.bos_token_id is not None))
        self.chat_template: str | None = self.config.get("chat_template")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._bytes: dict[int, bytes] = {}
        self._pieces: _PieceDecoder | None = None  # read from tokenizer.json on first use

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos and bos is not None and ids[:1] != [bos]:
            ids.insert(0, bos)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text: str = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for, as it reads mid-text: a byte-fallback piece
        ``<0xNN>`` is that byte, SentencePiece's "▁" is a space (also at the start: no
        strip), a byte-level BPE piece maps back through its byte alphabet, an added token
        (special ones included, e.g. ``</s>``) is its content. An id outside the
        vocabulary is b"". A token's bytes can be part of a UTF-8 character."""
        found = self._bytes.get(token_id)
        if found is None:
            if self._pieces is None:
                self._pieces = _PieceDecoder(json.loads(self._tok.to_str()))
            piece = self._tok.id_to_token(token_id)
            if piece is None:
                found = b""
            elif token_id in self._pieces.added:
                found = piece.encode()
            else:
                found = self._pieces.bytes(piece)
            self._bytes[token_id] = found
        return found

    def to_json(self) -> str:
        """The tokenizer.json text (the grammar library reads each token's bytes from it)."""
        text: str = self._tok.to_str()
        return text


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character for each byte value, reversed."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    stand_ins, extra = {}, 0
    for b in range(256):
        if b in printable:
            stand_ins[chr(b)] = b
        else:
            stand_ins[chr(256 + extra)] = b
            extra += 1
    return stand_ins


class _PieceDecoder:
    """How a vocabulary piece turns into bytes, read from tokenizer.json's decoder."""

    def __init__(self, spec: dict[str, Any]) -> None:
        decoders = _flatten(spec.get("decoder") or {})
        kinds = {d.get("type") for d in decoders}
        self.added = {int(t["id"]) for t in spec.get("added_tokens") or ()}
        self.byte_level = "ByteLevel" in kinds
        model = spec.get("model") or {}
        self.byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in kinds
        self.spaces: list[str] = []  # the characters that stand for a space ("▁")
        for d in decoders:
            if d.get("type") == "Metaspace":
                self.spaces.append(d.get("replacement") or "\u2581")
            pattern = d.get("pattern") or {}
            if d.get("type") == "Replace" and d.get("content") == " " and "String" in pattern:
                self.spaces.append(pattern["String"])
        self._alphabet = byte_level_alphabet() if self.byte_level else {}

    def bytes(self, piece: str) -> bytes:
        if self.byte_level:
            alphabet = self._alphabet
            return b"".join(bytes([alphabet[c]]) if c in alphabet else c.encode() for c in piece)
        if self.byte_fallback and (m := _BYTE_PIECE.fullmatch(piece)):
            return bytes([int(m.group(1), 16)])
        for space in self.spaces:
            piece = piece.replace(space, " ")
        return piece.encode()


def _flatten(decoder: dict[str, Any]) -> list[dict[str, Any]]:
    if decoder.get("type") == "Sequence":
        return [d for inner in decoder.get("decoders") or () for d in _flatten(inner)]
    return [decoder] if decoder else []


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _token_id(tok: Tokenizer, token: object, fallback: object) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    if isinstance(token, str):
        found = tok._tok.token_to_id(token)
        if found is not None:
            return int(found)
    return int(fallback) if isinstance(fallback, int) else None
