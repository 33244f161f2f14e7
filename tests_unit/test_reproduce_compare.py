"""`rlhf reproduce` promises byte for byte (rlhf.studies.reproduce.first_difference): values that
Python calls equal but JSON writes differently are differences, named at their first path, with
the committed value and the recomputed one each on its own side."""

import pytest

from rlhf.studies.reproduce import first_difference

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "committed, recomputed, text",
    [
        (1, 1.0, "committed 1, recomputed 1.0"),
        (1.0, 1, "committed 1.0, recomputed 1"),
        (0.0, -0.0, "committed 0.0, recomputed -0.0"),
        (True, 1, "committed True, recomputed 1"),
        (0, False, "committed 0, recomputed False"),
    ],
)
def test_values_python_calls_equal_are_different_bytes(committed, recomputed, text):
    assert committed == recomputed  # the premise: Python's equality would miss it
    row = {"a": {"b": [5, committed, 7]}, "z": 0}
    other = {"a": {"b": [5, recomputed, 7]}, "z": 0}
    assert first_difference(row, other) == f"row.a.b[1]: {text}"


def test_the_first_difference_is_the_first_path_in_key_order_and_sides_are_not_swapped():
    committed = {"b": {"x": 1, "y": 2}, "a": [1, 2]}
    recomputed = {"b": {"x": 1.0, "y": 3}, "a": [1, 2]}
    assert first_difference(committed, recomputed) == "row.b.x: committed 1, recomputed 1.0"
    assert first_difference(recomputed, committed) == "row.b.x: committed 1.0, recomputed 1"
    assert first_difference({"k": 1}, {"k": 1, "new": 0}) == "row.new: only in the recomputed row"
    assert first_difference({"k": 1, "old": 0}, {"k": 1}) == "row.old: only in the committed row"
    assert first_difference({"k": [1, 2]}, {"k": [1, 2, 3]}) == "row.k: committed [1, 2], recomputed [1, 2, 3]"
    assert first_difference({"k": 1}, {"k": 1}) is None
