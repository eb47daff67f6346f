"""Documents into batch lines: one request per .txt/.md file, split where too long.

A document whose prompt (the template around its text) would not fit the model's
context with ``max_tokens`` to spare is split on paragraph boundaries into chunks that
fit, named ``name#1``, ``name#2``, ...; a paragraph too long by itself is split between
words. Nothing is cut, and every split is reported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tide_fleet.infra.jobs.submission import ModelInfo


def split_document(text: str, template: str, fits: Callable[[str], bool]) -> list[str]:
    """Paragraph-packed chunks whose rendered prompt fits; words split an oversized paragraph."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    pieces: list[str] = []
    for para in paragraphs:
        if fits(template.format(text=para)):
            pieces.append(para)
            continue
        current: list[str] = []
        for word in para.split():
            if current and not fits(template.format(text=" ".join([*current, word]))):
                pieces.append(" ".join(current))
                current = []
            current.append(word)
        if current:
            pieces.append(" ".join(current))
    chunks: list[str] = []
    for piece in pieces:
        if chunks and fits(template.format(text=chunks[-1] + "\n\n" + piece)):
            chunks[-1] += "\n\n" + piece
        else:
            chunks.append(piece)
    return chunks


def docs_to_batch(
    folder: Path,
    template: str,
    max_tokens: int,
    info: ModelInfo,
    schema: dict[str, Any] | None = None,
) -> tuple[list[str], list[str]]:
    """(JSONL lines, human-readable notes about splits). With a JSON Schema, every request
    asks for output that matches it (``response_format`` json_schema)."""
    if "{text}" not in template:
        raise SystemExit("--template must contain {text}")
    context = info.config.max_model_len

    def fits(prompt: str) -> bool:
        return len(info.tokenizer.encode(prompt)) + max_tokens <= context

    lines, notes = [], []
    files = sorted(
        p for p in folder.iterdir() if p.suffix.lower() in (".txt", ".md") and p.is_file()
    )
    if not files:
        raise SystemExit(f"no .txt or .md files in {folder}")
    for path in files:
        chunks = split_document(path.read_text(), template, fits)
        if len(chunks) > 1:
            notes.append(f"{path.name}: longer than the context ({context} tokens with "
                         f"max_tokens {max_tokens}); split into {len(chunks)} chunks")  # fmt: skip
        for i, chunk in enumerate(chunks, 1):
            custom_id = path.name if len(chunks) == 1 else f"{path.name}#{i}"
            body: dict[str, Any] = {"prompt": template.format(text=chunk), "max_tokens": max_tokens}
            if schema is not None:
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "document", "schema": schema, "strict": True},
                }
            lines.append(json.dumps({"custom_id": custom_id, "method": "POST",
                                     "url": "/v1/completions", "body": body}))  # fmt: skip
    return lines, notes
