"""rlhf.runtime sits at the bottom of the import graph and runs before torch exists.

Every module may import it (nothing in it imports from rlhf, the profile's type only for
annotations), and `import rlhf` applies the CPU pin through it, which works only while torch is
not yet imported: torch is imported inside the functions that need it, never at module level.
The pin itself is tested in tests_reproducibility/test_pin.py.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf import runtime

pytestmark = pytest.mark.unit


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imported(nodes) -> set[str]:
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in rlhf/runtime.py: line {node.lineno}"
            names.add(node.module.split(".")[0])
    return names


def test_runtime_is_at_the_bottom_of_the_import_graph():
    """At module level: the standard library only (rlhf under TYPE_CHECKING alone); in function
    bodies: torch and the standard library, nothing from rlhf."""
    tree = ast.parse(Path(runtime.__file__).read_text())
    module_level = _imported(node for node in tree.body if not _is_type_checking(node))
    assert module_level <= set(sys.stdlib_module_names) | {"__future__"}, module_level - set(sys.stdlib_module_names)
    type_checking = [n for node in tree.body if _is_type_checking(node) for n in ast.walk(node)]
    assert _imported(type_checking) <= {"rlhf"}
    in_functions = _imported(n for node in tree.body if isinstance(node, ast.FunctionDef) for n in ast.walk(node))
    assert in_functions <= set(sys.stdlib_module_names) | {"torch"}, in_functions


def test_importing_rlhf_does_not_import_torch():
    """The pin is applied by `import rlhf`; had that imported torch, the pin would come too late."""
    code = (
        "import json, sys, rlhf; from rlhf import runtime; print(json.dumps(['torch' in sys.modules, runtime.apply()]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    torch_loaded, status = json.loads(done.stdout)
    assert torch_loaded is False
    assert status in ("pinned", "off")
