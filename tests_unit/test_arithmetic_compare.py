"""How two arithmetic fingerprints are compared (rlhf.arithmetic.differences and the verdict built
on it), on hand-made fingerprints: no measurement, so these run in the inner loop (the measuring
tests, with their subprocesses and the emulated CPU, are in test_arithmetic.py).

An entry that only one fingerprint holds (an older fingerprint, another version of the lab) is not
compared: it never counts as a differing entry, on either side; the verdict names it instead as an
entry held on one side only.
"""

from __future__ import annotations

import pytest

from rlhf import arithmetic

pytestmark = pytest.mark.unit


def fingerprint(ops: dict[str, str], model: dict[str, str]) -> dict:
    """A fingerprint in the module's format: (name, hash) entries in execution order, a
    comparable pinned environment, and its class."""
    fp = {
        "env": {"arithmetic": {"comparable": True, "note": "pinned"}},
        "ops": [[name, value] for name, value in ops.items()],
        "model": [[name, value] for name, value in model.items()],
    }
    fp["class"] = arithmetic.class_of(fp)
    return fp


OPS = {"matmul": "a" * 16, "softmax": "b" * 16, "adamw.step1": "c" * 16}
MODEL = {"embed.out": "d" * 16, "lm_head.grad": "e" * 16}


@pytest.mark.parametrize("side", ["here", "there"])
def test_an_entry_one_side_lacks_is_not_a_difference(side):
    """An entry this machine holds and the other lacks ("here"), or the other way round ("there"):
    nothing differs, the shared entries are all compared, and the verdict names the entry."""
    more = {**OPS, "rope.new_entry": "f" * 16}
    mine = fingerprint(more if side == "here" else OPS, MODEL)
    theirs = fingerprint(OPS if side == "here" else more, MODEL)
    assert mine["class"] != theirs["class"]
    assert arithmetic.differences(mine, theirs) == []
    assert arithmetic.compared(mine, theirs) == len(OPS) + len(MODEL)
    v = arithmetic.verdict(mine, {"cpu-x": theirs})
    assert v["verified"] is None and v["first_difference"] == {"cpu-x": None}
    assert f"cpu-x in which entries it holds (ops.rope.new_entry only {side})" in v["line"]


def test_a_shared_entry_that_differs_is_named_beside_entries_one_side_lacks():
    """Both sides lack an entry the other holds, and one shared entry differs: that one alone
    is named, in this machine's execution order, and it is the verdict's first difference."""
    mine = fingerprint({**OPS, "softmax": "0" * 16, "only.here": "1" * 16}, MODEL)
    theirs = fingerprint({"only.there": "2" * 16, **OPS}, {**MODEL, "lm_head.grad": "3" * 16})
    assert arithmetic.differences(mine, theirs) == ["ops.softmax", "model.lm_head.grad"]
    assert arithmetic.compared(mine, theirs) == len(OPS) + len(MODEL)
    v = arithmetic.verdict(mine, {"cpu-b": theirs})
    assert v["verified"] is None and v["first_difference"] == {"cpu-b": "ops.softmax"}
    assert "cpu-b from ops.softmax" in v["line"]
