"""The import graph between the repository's files: no cycles, and each layer imports only downward.

Every `import` and `from ... import` statement counts, at module level and inside functions alike:
a lazy import hides a cycle from Python's loader, not from a reader. An edge goes to the file that
defines the imported module (`from analysis import stats` -> analysis/stats.py, `from pipeline.paths
import RunPaths` -> pipeline/paths.py). Run alone: `python -m pytest -q tests/test_imports.py`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "analysis", "vattn", "benchmarks")

# pipeline/config holds the recipe models; the parts that run things sit above it.
CONFIG_MAY_NOT_IMPORT = ("pipeline/stages/", "pipeline/runner.py", "pipeline/engines/", "pipeline/hosts.py",
                         "pipeline/plan.py", "pipeline/emulator/", "pipeline/accuracy/")


def module_file(module: str) -> str | None:
    """Repo-relative path of the file that defines `module`, or None if it is not one of ours."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return str((base / "__init__.py").relative_to(ROOT))
    if base.with_suffix(".py").is_file():
        return str(base.with_suffix(".py").relative_to(ROOT))
    return None


def imports_of(path: Path) -> set[str]:
    """Files (repo-relative) that `path` imports anywhere in its body."""
    rel = path.relative_to(ROOT)
    package = list(rel.parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base_parts = package[:len(package) - node.level + 1] if node.level else []
            base = ".".join(base_parts + ([node.module] if node.module else []))
            # `from pkg import name` imports pkg.name when that is a module, else pkg itself
            names = [f"{base}.{a.name}" if module_file(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        found |= {f for f in map(module_file, names) if f and f != str(rel)}
    return found


def build_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return {str(p.relative_to(ROOT)): imports_of(p) for p in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return build_graph()


def test_the_walker_sees_function_level_imports():
    # the check is only as good as its edges: a function-level import must count
    assert "analysis/report.py" in imports_of(ROOT / "pipeline/cli.py")  # inside cmd_report only
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_between_files(graph):
    found = cycles(graph)
    assert not found, "import cycles (move the shared piece into a module both import): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_vattn_imports_nothing_of_pipeline_analysis_or_benchmarks(graph):
    bad = sorted((src, dst) for src, dsts in graph.items() if src.startswith("vattn/") for dst in dsts
                 if dst.startswith(("pipeline/", "analysis/", "benchmarks/")))
    assert not bad, f"vattn must stay usable on its own; it imports: {bad}"


def test_the_product_does_not_import_benchmark_tooling(graph):
    bad = sorted((src, dst) for src, dsts in graph.items() if src.startswith(("pipeline/", "analysis/"))
                 for dst in dsts if dst.startswith("benchmarks/"))
    assert not bad, f"benchmarks/ sits beside the product, not under it: {bad}"


def test_config_imports_no_runtime(graph):
    bad = sorted((src, dst) for src, dsts in graph.items() if src.startswith("pipeline/config/") for dst in dsts
                 if dst.startswith(CONFIG_MAY_NOT_IMPORT))
    assert not bad, f"pipeline/config must not import what runs a recipe: {bad}"
