"""Every number a profile holds has a declared range (rlhf.config.RANGES), and a value outside it
is refused when the profile is loaded or overridden, naming the table, the key, the range and the
value, before anything is written. Valid profiles load unchanged."""

from __future__ import annotations

import dataclasses
import math
import re
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_budget import examples

from rlhf.config import (
    RANGES,
    STUDY_TABLES,
    Profile,
    ProfileError,
    load_profile,
    override,
    profile_hash,
    profile_text_with,
)

pytestmark = pytest.mark.unit

EMBEDDED = load_profile("embedded")


def numeric_keys(tables) -> dict[tuple[str, str], type]:
    """(table, key) -> int or float, for every numeric key of every (name, table class)."""
    out = {}
    for table, cls in tables:
        if not dataclasses.is_dataclass(cls):
            continue
        for f in dataclasses.fields(cls):
            kind = typing.get_type_hints(cls)[f.name]
            inner = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
            if inner[0] in (int, float):
                out[(table, f.name)] = inner[0]
    return out


NUMERIC = numeric_keys(typing.get_type_hints(Profile).items())  # the profile's tables
STUDY_NUMERIC = numeric_keys((cls.TABLE, cls) for cls in STUDY_TABLES)  # those a study declares beside it
DPO = {"epochs": 1, "lr": 1e-4, "expected_updates": 1, "beta": 0.1, "pairs_per_update": 8}  # a valid [dpo]


def test_every_number_of_a_profile_has_a_declared_range_and_no_range_names_a_missing_key():
    assert not set(NUMERIC) & set(STUDY_NUMERIC)
    assert set(NUMERIC) | set(STUDY_NUMERIC) == set(RANGES)


def test_a_study_table_refuses_a_value_outside_its_range_naming_key_range_and_value():
    from rlhf.config import Dpo

    assert {t for t, _ in STUDY_NUMERIC} == {"dpo"} and Dpo(**DPO).beta == 0.1
    for (table, key), kind in STUDY_NUMERIC.items():
        for value in outside(RANGES[(table, key)], kind):
            with pytest.raises(ProfileError) as err:
                Dpo(**{**DPO, key: value})
            assert str(err.value).startswith(f"[{table}] {key} must be ") and str(RANGES[(table, key)]) in str(
                err.value
            )


def outside(valid, kind):
    """Values a key may not take: below lo, above hi, at an open bound, and (floats) NaN and inf."""
    values = []
    if valid.lo is not None:
        values += [valid.lo - (1 if kind is int else 0.5), valid.lo - 1000]
        if valid.lo_open:
            values.append(valid.lo)
    if valid.hi is not None:
        values += [valid.hi + (1 if kind is int else 0.5), valid.hi * 10 + 1]
        if valid.hi_open:
            values.append(valid.hi)
    if kind is float:
        values += [math.nan, math.inf, -math.inf]
    return [kind(v) if kind is int else float(v) for v in values]


CASES = [(key, v) for key, kind in NUMERIC.items() for v in outside(RANGES[key], kind)]


@examples(120)
@given(st.sampled_from(CASES))
def test_a_value_outside_its_range_is_refused_naming_key_range_and_value(case):
    (table, key), value = case
    with pytest.raises(ProfileError) as err:
        override(EMBEDDED, {(table, key): value})
    message = str(err.value)
    assert f"table [{table}]: {key} must be " in message and str(RANGES[(table, key)]) in message
    assert message.endswith(f"not {value}")


def test_every_out_of_range_case_is_refused():
    """The same cases, each once (the property above draws among them)."""
    for (table, key), value in CASES:
        with pytest.raises(ProfileError, match=rf"{key} must be"):
            override(EMBEDDED, {(table, key): value})


def test_the_values_the_issue_of_nonsense_named_are_refused_at_load_from_a_file(tmp_path):
    nonsense = {
        ("ppo", "kl_coef"): math.nan,
        ("ppo", "clip"): -0.2,
        ("ppo", "gamma"): 2.0,
        ("ppo", "lam"): 1.5,
        ("ppo", "actor_lr"): -1e-4,
        ("ppo", "temperature"): -1.0,
        ("ppo", "prompts_per_iteration"): 0,
        ("ppo", "iterations"): 0,
        ("sft", "epochs"): 0,
    }
    text = EMBEDDED.source.read_text()
    for (table, key), value in nonsense.items():
        path = tmp_path / f"{table}-{key}.toml"
        head, section = text.split(f"\n[{table}]\n")
        section = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", section, count=1)  # TOML writes NaN as nan
        path.write_text(f"{head}\n[{table}]\n{section}")
        with pytest.raises(ProfileError, match=rf"{path}: table \[{table}\]: {key} must be"):
            load_profile(str(path))


def test_valid_profiles_load_unchanged():
    assert profile_hash(EMBEDDED) == "41ec2214c4e7d5d737b770809120388f5104ba22158e20ed4b354183143df4c2"
    qwen = load_profile("qwen2.5-0.5b")
    for (table, key), valid in RANGES.items():
        if (table, key) in STUDY_NUMERIC:
            continue
        for p in (EMBEDDED, qwen):
            value = getattr(getattr(p, table), key)
            assert value is None or valid.holds(value), (p.name, table, key, value)


def test_a_bad_profile_is_refused_before_the_lab_writes_anything(tmp_path):
    from rlhf import cli

    path = tmp_path / "bad.toml"
    path.write_text(profile_text_with(EMBEDDED.source.read_text(), "bad", {("ppo", "clip"): 1.5}))
    out = tmp_path / "run"
    assert cli.main(["lab", "--profile", str(path), "--out", str(out)]) != 0
    assert not out.exists()
