"""docs/terraform.md and terraform/examples/two_pools agree: every module variable the doc
names is set by the example (from one of its own variables, `pools`, or another module's
output), and every example variable the modules receive is declared. Text only: no
terraform binary needed."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

TF = ROOT / "terraform"
EXAMPLE = TF / "examples/two_pools"
DOC = ROOT / "docs/terraform.md"


def declared(path: Path) -> set[str]:
    return set(re.findall(r'^variable "(\w+)"', path.read_text(), re.M))


def module_blocks() -> dict[str, dict[str, str]]:
    """The example's module calls: module folder -> {argument: expression}."""
    text = (EXAMPLE / "main.tf").read_text()
    out = {}
    for body in re.findall(r'^module "\w+" \{\n(.*?)^\}', text, re.M | re.S):
        source = re.search(r'^\s*source\s*=\s*"\.\./\.\./modules/(\w+)"', body, re.M)
        assert source is not None, body
        out[source.group(1)] = dict(re.findall(r"^\s*(\w+)\s*=\s*(.+?)\s*$", body, re.M))
    return out


def documented_names() -> set[str]:
    """Identifiers inside the doc's code blocks and `code spans`."""
    text = DOC.read_text()
    blocks = re.findall(r"^```.*?^```", text, re.M | re.S)
    for block in blocks:
        text = text.replace(block, "")
    spans = blocks + re.findall(r"`([^`]+)`", text)
    return {word for span in spans for word in re.findall(r"\b[a-z][a-z0-9_]*\b", span)}


def test_every_documented_module_variable_is_passed_through_by_the_example() -> None:
    blocks = module_blocks()
    assert set(blocks) == {"worker_pool", "control_plane"}
    example_vars = declared(EXAMPLE / "variables.tf")
    documented = documented_names()
    missing, undeclared = [], []
    for module, args in blocks.items():
        module_vars = declared(TF / "modules" / module / "variables.tf")
        assert set(args) - {"source", "for_each"} <= module_vars, (module, args)
        for name in sorted(documented & module_vars):
            if name not in args:
                missing.append(f"{module}.{name}")
        for name, expr in args.items():
            ref = re.fullmatch(r"var\.(\w+)", expr)
            if ref and ref.group(1) not in example_vars:
                undeclared.append(f"{module}.{name} = {expr}")
    assert not missing, f"documented in docs/terraform.md, not set by the example: {missing}"
    assert not undeclared, f"the example passes variables it does not declare: {undeclared}"


def test_every_example_variable_is_used() -> None:
    used = set()
    for path in EXAMPLE.glob("*.tf"):
        used |= set(re.findall(r"\bvar\.(\w+)", path.read_text()))
    assert declared(EXAMPLE / "variables.tf") - used == set()


def test_the_doc_lists_the_example_variables() -> None:
    """The example's own variables (deployment choices and the tfvars) are all named in the
    doc, so an operator finds each one."""
    names = documented_names()
    assert sorted(declared(EXAMPLE / "variables.tf") - names) == []
