"""The package's layers, read from its import statements (docs/architecture.md has the map).

Every `import` and `from ... import` in mlxcel_py counts, those inside functions too (a lazy
import is still a dependency); only `if TYPE_CHECKING:` blocks are skipped (they never run). A
module may import modules of a lower layer, and modules of its own package; an edge across
packages of one layer, or upwards, fails. The graph has no cycle at all, and the lowest layers
import nothing heavy, so `--help`, completion and validation never load MLX.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mlxcel_py"

# (module prefix, layer): the longest matching prefix decides
LAYERS = {
    "errors": 0,
    "options": 0,
    "paths": 0,
    "inputs": 0,
    "drafters.registry": 1,
    "config_file": 1,
    "formats": 1,
    "validate": 2,
    "validate_cache": 1,  # the KV cache type flags, checked by validate
    "validate_loading": 1,  # what loads and for how long: adapters, sleep, router mode
    "cpu": 3,
    "vision": 3,  # vision-language models: image checks, prompts with images, mlx-vlm loading
    "models": 4,
    "engine": 5,
    "parallel": 5,
    "drafters": 6,
    "session": 7,
    "api": 8,
    "terminal": 9,
    "server": 9,
    "bench": 9,
    "training": 9,  # `mlxcel draft train`: loads the target through api, writes a drafter
    "bench.checks": 3,  # bench's flags, checked with validate's rules before any model loads
    "commands": 10,
    "cli": 11,
    "__main__": 12,
    "__init__": 12,
    "completions": 12,
}
SAME_LAYER_OK = {("bench", "terminal")}  # the benchmark report prints its tables through terminal.ui
HEAVY = ("mlx", "mlx_lm", "typer", "rich", "fastapi", "uvicorn", "starlette", "numpy")
PRESENTATION = ("typer", "rich", "fastapi", "uvicorn", "starlette")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules of mlxcel_py this file imports, top-level names of other packages it imports)."""
    me = module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    if me == "__init__":
        package = []
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    ours: set[str] = set()
    theirs: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("mlxcel_py"):
                    ours.add(a.name.removeprefix("mlxcel_py").lstrip("."))
                else:
                    theirs.add(a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if (node.module or "").startswith("mlxcel_py"):
                    base = node.module.removeprefix("mlxcel_py").lstrip(".")
                else:
                    theirs.add((node.module or "").split(".")[0])
                    continue
            else:
                up = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:  # `from . import x` may name a module
                sub = f"{base}.{a.name}" if base else a.name
                ours.add(sub if _is_module(sub) else base)
    return {m for m in ours if m}, theirs


def _is_module(dotted: str) -> bool:
    p = PKG.joinpath(*dotted.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def layer_of(module: str) -> tuple[int, str]:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len, default=None)
    assert best is not None, f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)"
    return LAYERS[best], best


def package_of(module: str) -> str:
    return module.split(".")[0]


@functools.cache
def graph() -> dict[str, tuple[set[str], set[str]]]:
    return {module_name(p): imports(p) for p in sorted(PKG.rglob("*.py"))}


def test_every_module_has_a_layer():
    for module in graph():
        layer_of(module)


def test_no_edge_goes_up_or_across():
    bad = []
    for module, (ours, _) in graph().items():
        mine, _ = layer_of(module)
        for dep in ours:
            theirs, _ = layer_of(dep)
            same_package = package_of(dep) == package_of(module)
            if same_package and theirs == mine:
                continue
            if theirs < mine:
                continue
            if theirs == mine and (package_of(module), package_of(dep)) in SAME_LAYER_OK:
                continue
            bad.append(f"{module} (layer {mine}) imports {dep} (layer {theirs})")
    assert not bad, "\n".join(bad)


def test_only_cli_imports_commands():
    for module, (ours, _) in graph().items():
        if any(package_of(d) == "commands" for d in ours):
            assert package_of(module) in ("commands", "cli"), module


def test_no_import_cycle():
    deps = {m: {d for d in ours if d in graph_modules} for m, (ours, _) in graph().items()}
    # Tarjan's strongly connected components; any component of two or more modules is a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in deps[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in deps[v]:
                cycles.append(sorted(comp))

    for v in deps:
        if v not in index:
            visit(v)
    assert not cycles, cycles


graph_modules = set(graph())


@pytest.mark.parametrize("module", sorted(m for m in graph_modules if layer_of(m)[0] <= 2))
def test_the_pure_layers_import_nothing_heavy(module):
    _, theirs = graph()[module]
    assert not (theirs & set(HEAVY)), f"{module} imports {sorted(theirs & set(HEAVY))}"


@pytest.mark.parametrize("module", sorted(m for m in graph_modules if 3 <= layer_of(m)[0] <= 8))
def test_the_core_imports_no_presentation(module):
    _, theirs = graph()[module]
    assert not (theirs & set(PRESENTATION)), f"{module} imports {sorted(theirs & set(PRESENTATION))}"


def test_server_knows_no_terminal_and_the_engine_no_drafter_kind():
    for module, (ours, _) in graph().items():
        if package_of(module) == "server":
            assert not any(package_of(d) in ("terminal", "commands", "bench") for d in ours), module
        if package_of(module) == "engine":
            assert not any(package_of(d) in ("drafters", "session", "api") for d in ours), module


def test_the_top_level_stays_small():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 12, top
