"""Tokenizer from ``tokenizer.json`` plus the generation and tokenizer configs beside it.

Torch-free, so the gateway can count tokens with exactly what the workers use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from worker.models.config import ModelLoadError


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

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos and bos is not None and ids[:1] != [bos]:
            ids.insert(0, bos)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text: str = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return text

    def to_json(self) -> str:
        """The tokenizer.json text (the grammar library reads each token's bytes from it)."""
        text: str = self._tok.to_str()
        return text


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
