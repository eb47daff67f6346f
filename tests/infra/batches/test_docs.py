"""Documents into batch lines (`tide batch docs`): chunks fit, nothing is cut, splits reported."""

from __future__ import annotations

import json

from tide_fleet.infra.batches.docs import docs_to_batch, split_document
from tide_fleet.infra.jobs.submission import ModelInfo


def test_split_keeps_every_word_and_fits():
    text = "\n\n".join(f"para {i} " + "word " * (5 + i * 7) for i in range(8))

    def fits(prompt: str) -> bool:
        return len(prompt.split()) <= 30

    chunks = split_document(text, "S: {text}", fits)
    assert len(chunks) > 1
    assert all(fits(f"S: {c}") for c in chunks)
    assert " ".join(" ".join(chunks).split()) == " ".join(text.split())


def test_docs_to_batch_names_chunks_and_reports_splits(tmp_path, tiny_path):
    (tmp_path / "short.txt").write_text("A short note.")
    (tmp_path / "big.md").write_text("\n\n".join("x" * 300 for _ in range(6)))  # ~1,800 bytes
    (tmp_path / "ignored.pdf").write_text("not a text file")
    lines, notes = docs_to_batch(tmp_path, "Summarize:\n{text}", 64, ModelInfo.load(str(tiny_path)))
    ids = [json.loads(x)["custom_id"] for x in lines]
    assert ids[0].startswith("big.md#1") and "short.txt" in ids
    assert all(i.startswith("big.md#") or i == "short.txt" for i in ids)
    assert len(notes) == 1 and "big.md" in notes[0] and "split into" in notes[0]
    joined = "".join(
        json.loads(x)["body"]["prompt"].removeprefix("Summarize:\n") for x in lines[:-1]
    )
    assert joined.replace("\n", "") == "x" * 1800
