"""No import cycles between the project's modules, function-local imports included (the
layer contracts in pyproject.toml, run by `lint-imports`, hold the direction between
packages; this holds it between the files inside them)."""

from __future__ import annotations

import grimp

FOLDERS = ("gateway", "worker", "kernels", "infra")
PACKAGES = tuple(f"tide_fleet.{folder}" for folder in FOLDERS)


def test_no_module_imports_itself_back():
    graph = grimp.build_graph(*PACKAGES)
    modules = sorted(graph.modules)
    imports = {m: graph.find_modules_directly_imported_by(m) & graph.modules for m in modules}
    # A package's __init__ that re-exports its modules is not a cycle of ideas.
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in sorted(imports[m]):
            if dep.startswith(m + ".") or m.startswith(dep + "."):
                continue  # a package and its own modules
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep] if dep in path else [m, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[m] = 2

    for m in modules:
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_takes_another_modules_private_names():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    if ".".join(node.module.split(".")[:2]) not in PACKAGES:
                        continue
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    if private:
                        found.append(f"{path.relative_to(root)}: {node.module} {private}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)
