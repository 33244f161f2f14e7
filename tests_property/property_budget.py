"""How many examples a property test draws.

Under the default "rlhf" profile (derandomized, what CI runs) each test draws the number it
names, sized to keep the layer fast. Under any other profile, e.g.
`pytest tests_property --hypothesis-profile=explore` (conftest.py), it draws the profile's
max_examples when that is more: the same properties, searched with fresh random examples.
"""

from __future__ import annotations

from hypothesis import settings


def examples(n: int) -> settings:
    """settings(max_examples=n) in CI; at least the loaded profile's max_examples otherwise."""
    current = settings.default  # the profile loaded now (pytest loads --hypothesis-profile first)
    if current.derandomize:
        return settings(max_examples=n)
    return settings(max_examples=max(n, current.max_examples))
