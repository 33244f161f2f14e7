"""Typed profiles (rlhf/config.py): every TOML table a frozen dataclass whose fields are
documented; an unknown, missing or wrongly typed key is an error that names the file, the table
and the key; no key that the code never reads; `override` checks like a file does."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import rlhf
from rlhf.config import PROFILE_DIR, PROFILES, Profile, ProfileError, load_profile, override, profile_hash

pytestmark = pytest.mark.unit

PACKAGE = Path(rlhf.__file__).parent


def tables(profile_cls=Profile):
    return [(f.name, f.type) for f in dataclasses.fields(profile_cls) if dataclasses.is_dataclass(f.type)]


def all_fields():
    p = load_profile("embedded")
    out = [("", f) for f in dataclasses.fields(Profile)]
    for f in dataclasses.fields(Profile):
        value = getattr(p, f.name)
        if dataclasses.is_dataclass(value):
            out += [(f.name, g) for g in dataclasses.fields(value)]
    return out


def test_every_field_is_documented():
    undocumented = [f"{table}.{f.name}" for table, f in all_fields() if not f.metadata.get("doc", "").strip()]
    assert not undocumented


def test_every_key_is_read_by_the_code():
    """No dead keys: each field name is used somewhere in the package outside config.py."""
    code = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "config.py")
    unread = [f"{table}.{f.name}" for table, f in all_fields() if table and not re.search(rf"\b{f.name}\b", code)]
    assert not unread


@pytest.mark.parametrize("name", PROFILES)
def test_both_profiles_load_frozen_with_one_source_per_seed(name):
    p = load_profile(name)
    assert p.source == PROFILE_DIR / f"{name}.toml"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.ppo.kl_coef = 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "other"
    text = p.source.read_text()
    for dead in ("dropout", "judge_seed", "corpus"):
        assert not re.search(rf"^{dead}\s*=", text, re.M), dead
    assert not hasattr(p.lora, "seed") and not hasattr(p.seeds, "corpus")
    assert (p.seeds.lora, p.seeds.judge_lora, p.seeds.judge_head, p.seeds.evaluation) == (49, 50, 50, 349)  # SPEC §10


def write_variant(tmp_path, edit) -> Path:
    text = (PROFILE_DIR / "embedded.toml").read_text()
    path = tmp_path / "variant.toml"
    path.write_text(edit(text))
    return path


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda t: t.replace("[ppo]\n", "[ppo]\nkl_coeff = 0.1\n"), r"table \[ppo\]: unknown key kl_coeff"),
        (
            lambda t: t.replace("[lora]\n", "[lora]\ndropout = 0.0\n"),
            r"table \[lora\]: unknown key dropout",
        ),  # dead key
        (lambda t: re.sub(r"^lam = .*\n", "", t, flags=re.M), r"table \[ppo\]: missing key 'lam'"),
        (lambda t: t.replace("[runtime]\n", "[runtime_]\n"), r"unknown table or key runtime_"),
    ],
    ids=["unknown-key", "removed-dead-key", "missing-key", "misspelt-table"],
)
def test_unknown_or_missing_keys_name_file_table_and_key(tmp_path, edit, message):
    path = write_variant(tmp_path, edit)
    with pytest.raises(ProfileError, match=rf"profile {re.escape(str(path))}: {message}"):
        load_profile(path)


@pytest.mark.parametrize(
    "line,new,message",
    [
        ("epochs = 20", 'epochs = "20"', r"table \[sft\]: key 'epochs' must be int, got str"),
        ("epochs = 20", "epochs = true", r"table \[sft\]: key 'epochs' must be int, got bool"),
        ("epochs = 20", "epochs = 20.5", r"table \[sft\]: key 'epochs' must be int, got float"),
        (
            "tie_word_embeddings = true",
            "tie_word_embeddings = 1",
            r"table \[model\]: key 'tie_word_embeddings' must be bool",
        ),
        ('targets = ["q_proj"', 'targets = [1, "q_proj"', r"table \[lora\]: key 'targets' must be a list of strings"),
    ],
)
def test_wrong_type_names_file_table_and_key(tmp_path, line, new, message):
    path = write_variant(tmp_path, lambda t: t.replace(line, new, 1))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)


def test_an_integer_where_a_float_is_expected_is_that_float(tmp_path):
    path = write_variant(tmp_path, lambda t: t.replace("gamma = 1.0", "gamma = 1"))
    p = load_profile(path)
    assert p.ppo.gamma == 1.0 and isinstance(p.ppo.gamma, float)
    assert profile_hash(p) == profile_hash(load_profile("embedded"))


def test_invalid_toml_is_a_profile_error_naming_the_file(tmp_path):
    path = write_variant(tmp_path, lambda t: t + "\n[ppo\n")
    with pytest.raises(ProfileError, match=rf"{re.escape(str(path))}: not valid TOML"):
        load_profile(path)


def test_override_is_checked_and_leaves_the_original_alone():
    p = load_profile("embedded")
    small = override(p, {("ppo", "iterations"): 4, ("sft", "max_updates_per_epoch"): 3, (None, "name"): "x"})
    assert (small.ppo.iterations, small.sft.max_updates_per_epoch, small.name) == (4, 3, "x")
    assert (p.ppo.iterations, p.sft.max_updates_per_epoch, p.name) == (100, None, "embedded")
    assert profile_hash(small) != profile_hash(p)
    assert profile_hash(override(p, {})) == profile_hash(p)
    with pytest.raises(ProfileError, match=r"no key 'iteration' in table \[ppo\]"):
        override(p, {("ppo", "iteration"): 4})
    with pytest.raises(ProfileError, match=r"table \[ppo\]: key 'iterations' must be int"):
        override(p, {("ppo", "iterations"): "4"})


def test_a_role_whose_adapters_differ_from_the_profile_is_refused(embedded_profile, embedded_dir):
    from rlhf.roles import new_role

    wrong = override(embedded_profile, {("lora", "expected_parameters"): 22529})
    with pytest.raises(
        ValueError,
        match=r"the actor has 14 adapters with 22,528 parameters; \[lora\] expects 14 "
        r"with 22,529",
    ):
        new_role("actor", wrong, embedded_dir)


def test_the_compute_dtype_is_declared_checked_and_never_rounds_float32_weights(tmp_path):
    """[runtime] compute_dtype ('auto' in both profiles; `rlhf lab --dtype` writes it in): an
    unknown value and BF16 over float32 weights are refused, by the profile and by the command,
    before anything is written."""
    from rlhf.cli import main

    embedded, qwen = load_profile("embedded"), load_profile("qwen2.5-0.5b")
    assert embedded.runtime.compute_dtype == "auto" and qwen.runtime.compute_dtype == "auto"
    forced = override(qwen, {("runtime", "compute_dtype"): "float32"})
    assert forced.runtime.compute_dtype == "float32" and profile_hash(forced) != profile_hash(qwen)
    with pytest.raises(ProfileError, match="would round the model's float32 weights"):
        override(embedded, {("runtime", "compute_dtype"): "bfloat16"})
    with pytest.raises(ProfileError, match="compute_dtype must be 'auto', 'float32' or 'bfloat16', not 'float16'"):
        override(qwen, {("runtime", "compute_dtype"): "float16"})
    assert main(["lab", "--dtype", "bfloat16", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()
