"""scripts/ holds tools: each is cited by the docs or the Makefile (or is a sibling another
script imports), and none edits sys.path (they import the installed ``tide_fleet``)."""

from __future__ import annotations

import ast
import re

from tests.conftest import ROOT

SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
CITING = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]


def _imported_siblings() -> set[str]:
    names = {p.stem for p in SCRIPTS}
    found = set()
    for path in SCRIPTS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in names:
                found.add(node.module)
    return found


def test_every_script_is_cited_or_imported_by_one_that_is() -> None:
    cited = "\n".join(p.read_text() for p in CITING)
    siblings = _imported_siblings()
    orphans = [p.name for p in SCRIPTS if p.name not in cited and p.stem not in siblings]
    assert not orphans, f"scripts no doc, Makefile or script uses: {orphans}"


def test_no_script_edits_sys_path() -> None:
    edits = re.compile(r"sys\.path\.(insert|append|extend)\(|sys\.path\s*[+]?=")
    offenders = [p.name for p in SCRIPTS if edits.search(p.read_text())]
    assert not offenders, offenders


def test_tests_do_not_import_scripts() -> None:
    names = {p.stem for p in SCRIPTS}
    offenders = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and (module in names or module.split(".")[0] == "scripts"):
                offenders.append(f"{path.relative_to(ROOT)}: {node.module}")
    assert not offenders, offenders
