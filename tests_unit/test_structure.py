"""The package's shape: modules small enough to read, an import graph without circles, and the
layered packages (the lab, the corpus, the frontier) whose modules import only those above them
in the order their package docstring lists. Read from the source (no import), so it is fast."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "rlhf"
MAX_LINES = 600
LAYERED = ("lab", "corpus", "studies/frontier")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def top_level_imports(path: Path, known: set[str]) -> set[str]:
    """The rlhf modules `path` imports when it is imported (module level, not inside functions:
    those are the deliberate late imports), resolved to modules (`from rlhf import lab` is rlhf.lab)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlhf"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.add(full if full in known else node.module)
    return out & known


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: top_level_imports(p, known) - {m} for m, p in mods.items()}


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `g` (a package importing its own submodules in __init__ is not one)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if m.startswith(n + "."):  # a submodule importing a name its package re-exports goes up one
                continue
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


def declared_layers(package: str) -> list[str]:
    """The module order a layered package's docstring lists, after 'each importing only those above it'."""
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())) or ""
    listing = doc.split("importing only those above it", 1)[1]
    return re.findall(r"^    (\w+)\s{2,}", listing, flags=re.M)


def test_no_module_is_over_600_lines():
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_the_import_graph_has_no_circle():
    assert cycle(graph()) is None


def test_a_circle_is_found():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", LAYERED)
def test_a_layered_package_s_modules_import_only_those_above_them(package):
    layers = declared_layers(package)
    prefix = "rlhf." + package.replace("/", ".")
    on_disk = {p.stem for p in (PACKAGE / package).glob("*.py")} - {"__init__"}
    assert set(layers) == on_disk, f"{package}/__init__.py lists {layers}, the folder holds {sorted(on_disk)}"
    g = graph()
    for i, layer in enumerate(layers):
        mine = {m.removeprefix(prefix + ".") for m in g[f"{prefix}.{layer}"] if m.startswith(prefix + ".")}
        assert mine <= set(layers[:i]), f"{prefix}.{layer} imports {sorted(mine - set(layers[:i]))}, not above it"
