"""The README, docs/ and the sources describe the product as it is: no development history
(numbered sessions, rounds or issues, the issue's bar, temporary harnesses, "this VM") in a
doc line, docstring or comment. History lives in git."""

from __future__ import annotations

import re

from tests.conftest import ROOT

HISTORY = re.compile(
    r"(?<!-)\b(session|round|issue|ticket)s? #?\d+"
    r"|issue's bar|the seed's|\bthis (VM|2-core machine)\b|/tmp harness|tried and dropped",
    re.IGNORECASE,
)
FOLDERS = ("gateway", "worker", "kernels", "infra", "scripts", "tests", "docs", "terraform")
SUFFIXES = {".py", ".md", ".cpp", ".h", ".tf", ".tftpl", ".toml", ".js", ".html", ".css"}


def _files():
    yield ROOT / "README.md"
    yield ROOT / "Makefile"
    yield ROOT / "pyproject.toml"
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SUFFIXES and "vendor" not in path.parts and path.is_file():
                yield path


def test_no_line_carries_development_history() -> None:
    me = __file__
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
        for path in _files()
        if str(path) != me
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "development history:\n" + "\n".join(found)
