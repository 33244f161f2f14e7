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


# ----------------------------------------------------------------- the compute dtype, by the CPU's flags

AVX2_ONLY = frozenset({"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"})  # AMD EPYC Zen 2/3, most laptops
AVX512_NO_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl"}  # e.g. Intel Skylake-SP
ZEN5 = AVX512_NO_BF16 | {"avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN5 | {"amx_bf16", "amx_tile"}


@pytest.mark.parametrize(
    "flags,dtype",
    [(AVX2_ONLY, "float32"), (AVX512_NO_BF16, "float32"), (ZEN5, "bfloat16"), (SAPPHIRE_RAPIDS, "bfloat16")],
)
def test_bf16_weights_compute_in_bf16_only_where_the_cpu_has_native_bf16(flags, dtype):
    """Catches a choice made from the vendor or from AVX-512 alone (Skylake has AVX-512 and no
    BF16), and a choice that is not said."""
    choice = runtime.choose_dtype("bfloat16", "cpu", flags=flags)
    assert choice["dtype"] == dtype and choice["stored"] == "bfloat16" and choice["requested"] == "auto"
    other = "float32" if dtype == "bfloat16" else "bfloat16"
    assert choice["force"] == f"--dtype {other}"
    if dtype == "float32":
        assert "no native BF16" in choice["reason"] and "avx512_bf16" in choice["reason"]
    else:
        native = sorted(flags & {"avx512_bf16", "amx_bf16"})
        assert choice["reason"] == f"this CPU has native BF16 instructions ({', '.join(native)})"


def test_the_dtype_asked_for_wins_and_float32_weights_are_never_rounded():
    for flags in (AVX2_ONLY, SAPPHIRE_RAPIDS):
        for asked in ("float32", "bfloat16"):
            choice = runtime.choose_dtype("bfloat16", "cpu", asked, flags=flags)
            assert choice["dtype"] == asked and choice["reason"] == f"asked for (--dtype {asked})"
    assert runtime.choose_dtype("bfloat16", "cuda", flags=AVX2_ONLY)["dtype"] == "bfloat16"  # the GPU, not the CPU
    for device in ("cpu", "cuda"):
        fp32 = runtime.choose_dtype("float32", device, flags=SAPPHIRE_RAPIDS)
        assert fp32["dtype"] == "float32" and fp32["force"] is None
    with pytest.raises(ValueError, match="would round them"):
        runtime.choose_dtype("float32", "cpu", "bfloat16", flags=SAPPHIRE_RAPIDS)
    with pytest.raises(ValueError, match="compute dtype must be one of"):
        runtime.choose_dtype("bfloat16", "cpu", "float16", flags=AVX2_ONLY)
    unknown = runtime.choose_dtype("bfloat16", "cpu", flags=frozenset())
    assert unknown["dtype"] == "float32"
    # what `rlhf lab` prints: the stored dtype said once
    from rlhf.models import precision_line

    assert precision_line(fp32) == "precision: float32 (the weights are stored in float32)"
    assert precision_line(unknown).startswith("precision: float32 (weights stored in bfloat16; ")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path, monkeypatch):
    """The flags come from the kernel's report of the CPU (first `flags` line), not the vendor;
    an unreadable file means no native BF16 is assumed."""
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert runtime.cpu_flags(info) == {"fpu", "avx2", "avx512f", "avx512_bf16", "amx_bf16"}
    assert runtime.cpu_flags(tmp_path / "missing") is None
    monkeypatch.setattr(runtime, "cpu_flags", lambda path=None: None)
    choice = runtime.choose_dtype("bfloat16", "cpu")
    assert choice["dtype"] == "float32" and "cannot be read" in choice["reason"]
