"""What a study run changes in its profile: the training seeds of run i (and the SFT budget).

Each study run i (0 <= i < n) gets its own profile, written to DIR/seed-i/profile.toml, so
that the run is reproducible from its folder alone:

    rlhf lab --out DIR/seed-i --profile DIR/seed-i/profile.toml --revision REV

Every *training* seed (``TRAINING_SEEDS``: the global torch seed, the actor's and the judge's
LoRA init, the judge head, the data order of SFT/judge/PPO, PPO sampling) is derived from the
profile's own value, the study seed S and the run index i by ``derived_seed``:

    seed = profile seed + 100000 * S + 1000 * i

so run 0 of study seed 0 is exactly the profile's single run (the lab run of docs/results.md), two runs of a
study never share a seed (the profile's seeds differ by less than 1000), and two study seeds
never share one (n <= 100). The evaluation seed (349, ``FIXED_SEEDS``) and the corpus seed (49,
the corpus revision's own) are kept: every run sees the same corpus, the same held-out prompts and the same
bootstrap draws. The embedded base is built from its fixed seed 49 in every run (the
"pre-trained" model is not a training seed of RLHF). ``seed_changes`` is the one function that
says which profile entries are set.

`--sft-budget NAME` replaces the profile's SFT epochs by a named budget of ``SFT_BUDGETS``, or
its SFT by a named recipe of ``RECIPES`` (a lower rate, fewer demonstrations); the budget is
chosen on validation prompts only by `rlhf choose-sft-budget` (rlhf.studies.sft_budget), the
testbed among budgets and recipes by `rlhf choose-testbed` (rlhf.studies.testbed). A
study seed is refused (`check_study_seed`) where a seed of its runs would leave what a profile
and torch hold (``SEED_LIMIT``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from rlhf.config import (
    PROFILE_DIR,
    PROFILES,
    Profile,
    load_profile,
    override,
    profile_from_dict,
    profile_text_with,
)
from rlhf.io import write_text
from rlhf.studies import StudyError

# (table, key) of every training seed; all live in the profile's [seeds] table. The corpus seed
# (49) is the corpus revision's own (rlhf.corpus.REVISIONS), not a profile entry.
TRAINING_SEEDS = (
    ("seeds", "torch"),
    ("seeds", "lora"),
    ("seeds", "judge_lora"),
    ("seeds", "judge_head"),
    ("seeds", "data_order"),
    ("seeds", "ppo_sampling"),
)
FIXED_SEEDS = (("seeds", "evaluation"),)
RUN_STRIDE = 1000
STUDY_STRIDE = 100_000
MAX_RUNS = STUDY_STRIDE // RUN_STRIDE
# Every seed a run uses goes into its profile.toml, whose integers TOML holds as 64-bit signed
# (below 2**63), and then to torch.manual_seed / torch.Generator.manual_seed (below 2**64) and
# random.seed; the lab adds less than RUN_STRIDE to a training seed (an ensemble member's: + m).
SEED_LIMIT = 2**63
DERIVATION = (
    "training seed of run i = the profile's value + 100000 * study_seed + 1000 * i, for "
    + ", ".join(f"{t}.{k}" for t, k in TRAINING_SEEDS)
    + "; kept: "
    + ", ".join(f"{t}.{k}" for t, k in FIXED_SEEDS)
    + " and the corpus seed 49"
)


# Named SFT budgets (epochs of 21 updates; the embedded profile's own budget is 20 epochs, 420
# updates). `full` keeps the profile's. The budget of question (b) is chosen among the others
# (rlhf.studies.sft_budget).
SFT_BUDGETS: dict[str, int | None] = {"full": None, **{f"sft-e{k}": k for k in range(1, 11)}}
EPOCH_BUDGETS = {k: v for k, v in SFT_BUDGETS.items() if v is not None}  # the named budgets, 'full' excluded

# The SFT recipes of the testbed rule (rlhf.studies.testbed), beside the epoch budgets above: a
# lower peak rate over the profile's whole schedule, or fewer demonstrations (every k-th family,
# each situation keeping its share) trained for about the profile's number of updates, or for a
# declared share of them (`updates`: sft-demos6-u210 trains 6 demonstrations for 210 updates).
# A recipe may also set PPO's actor rate (`ppo_actor_lr`): the testbed is the SFT and the PPO
# that starts from it, and the SPEC lets the embedded profile change learning rates, not PPO's
# 4 prompts per iteration or 100 iterations.
DEMONSTRATIONS = 168  # train demonstrations of every revision (rlhf.corpus: one per train family)
RECIPES: dict[str, dict[str, float | int]] = {
    "sft-lr1e-3": {"lr": 1e-3},
    "sft-lr1.5e-3": {"lr": 1.5e-3},
    **{f"sft-demos{DEMONSTRATIONS // k}": {"demonstration_stride": k} for k in (2, 4, 7, 14, 28)},
    "sft-demos12-u210": {"demonstration_stride": 14, "updates": 210},
    "sft-demos6-u210": {"demonstration_stride": 28, "updates": 210},
    "sft-demos6-u105": {"demonstration_stride": 28, "updates": 105},
    "sft-demos6-ppo-lr5e-5": {"demonstration_stride": 28, "ppo_actor_lr": 5e-5},
    "sft-demos6-ppo-lr2.5e-5": {"demonstration_stride": 28, "ppo_actor_lr": 2.5e-5},
    "sft-demos12-ppo-lr5e-5": {"demonstration_stride": 14, "ppo_actor_lr": 5e-5},
}
# Recipe keys that are not [sft] keys: how many updates, and PPO's actor rate.
NOT_SFT_KEYS = ("updates", "ppo_actor_lr")
SFT_RECIPES = [*SFT_BUDGETS, *RECIPES]  # every name --sft-budget takes


def budget_changes(profile: Profile, budget: str) -> dict[tuple[str | None, str], object]:
    """{(table, key): value} of the named SFT budget (`full`: nothing changes)."""
    if budget in RECIPES:
        return recipe_changes(profile, RECIPES[budget])
    if budget not in SFT_BUDGETS:
        raise ValueError(f"unknown SFT budget {budget!r}; known: {', '.join(SFT_RECIPES)}")
    epochs = SFT_BUDGETS[budget]
    if epochs is None:
        return {}
    per_epoch = profile.sft.expected_updates // profile.sft.epochs
    return {("sft", "epochs"): epochs, ("sft", "expected_updates"): per_epoch * epochs}


def recipe_changes(profile: Profile, recipe: dict) -> dict[tuple[str | None, str], object]:
    """{(table, key): value} of an SFT recipe: its [sft] keys, PPO's actor rate where it sets one, and,
    for fewer demonstrations, the epochs that give the recipe's `updates` (absent: the profile's
    number of updates) again, the nearest whole number of epochs."""
    changes: dict[tuple[str | None, str], object] = {("sft", k): v for k, v in recipe.items() if k not in NOT_SFT_KEYS}
    if "ppo_actor_lr" in recipe:
        changes[("ppo", "actor_lr")] = recipe["ppo_actor_lr"]
    stride = recipe.get("demonstration_stride")
    if stride:
        cfg = profile.sft
        per_epoch = -(-len(range(0, DEMONSTRATIONS, stride)) // cfg.examples_per_update)
        epochs = max(1, round(recipe.get("updates", cfg.expected_updates) / per_epoch))
        changes |= {("sft", "epochs"): epochs, ("sft", "expected_updates"): per_epoch * epochs}
    return changes


def derived_seed(profile_seed: int, study_seed: int, index: int) -> int:
    """The training seed of run `index` of study `study_seed` (module docstring)."""
    return profile_seed + STUDY_STRIDE * study_seed + RUN_STRIDE * index


def profile_value(profile: Profile, table: str, key: str):
    """The profile's `[table] key`, addressed as rlhf.config.override addresses it."""
    return profile.to_dict()[table][key]


def max_study_seed(profile: Profile) -> int:
    """The largest study seed whose every run (up to MAX_RUNS) keeps each seed it uses, the lab's
    offsets included, below SEED_LIMIT."""
    top = max(profile_value(profile, t, k) for t, k in TRAINING_SEEDS)
    return (SEED_LIMIT - RUN_STRIDE * MAX_RUNS - top) // STUDY_STRIDE


def check_study_seed(profile: Profile, study_seed: int) -> None:
    """Refuse, naming the option, a study seed whose runs' seeds could not be written or used."""
    top = max_study_seed(profile)
    if not 0 <= study_seed <= top:
        raise StudyError(
            f"--study-seed must be between 0 and {top}, not {study_seed}: every training seed of its runs is "
            f"written into a profile and passed to torch, which take seeds from 0 to below {SEED_LIMIT} "
            f"(the seed of run i is the profile's + {STUDY_STRIDE} x study seed + {RUN_STRIDE} x i)"
        )


def seed_changes(profile: Profile, study_seed: int, index: int) -> dict[tuple[str, str], int]:
    """{(table, key): seed} for every training seed of run `index`: the one place that sets them."""
    if not 0 <= index < MAX_RUNS:
        raise StudyError(f"run index {index} outside 0..{MAX_RUNS - 1} (seeds would collide)")
    check_study_seed(profile, study_seed)
    return {(t, k): derived_seed(profile_value(profile, t, k), study_seed, index) for t, k in TRAINING_SEEDS}


def expected_profile(profile: Profile, name: str, changes: dict) -> Profile:
    """The profile that `profile_text_with` must produce (what the written file is checked against)."""
    return override(profile, {(None, "name"): name, **changes})


def profile_source(profile_name: str) -> Path:
    path = PROFILE_DIR / f"{profile_name}.toml" if profile_name in PROFILES else Path(profile_name)
    if not path.is_file():
        raise StudyError(f"no profile file {path}")
    return path


def write_study_profiles(out: Path, profile_name: str, n: int, study_seed: int, sft_budget: str) -> list[Path]:
    """out/seed-i/profile.toml for every run i < n of a study (checked on a rerun): the profile
    with run i's training seeds and the SFT budget written in, named after both; the run folders."""
    base_text = profile_source(profile_name).read_text()
    base = load_profile(str(profile_source(profile_name)))
    budget = budget_changes(base, sft_budget)
    folders = []
    for i in range(n):
        folder = out / f"seed-{i}"
        name = f"{base.name}-study{study_seed}-seed{i}" + ("" if sft_budget == "full" else f"-{sft_budget}")
        write_run_profile(folder / "profile.toml", base_text, name, {**seed_changes(base, study_seed, i), **budget})
        folders.append(folder)
    return folders


def write_run_profile(path, base_text: str, name: str, changes: dict) -> Profile:
    """Write the run's profile TOML (never overwriting a different one) and return it, read back
    with load_profile and checked to equal the intended profile."""

    want = expected_profile(profile_from_dict(tomllib.loads(base_text)), name, changes)
    text = profile_text_with(base_text, name, changes)
    path = Path(path)
    if path.is_file() and path.read_text() != text:
        raise StudyError(f"{path} exists with other content: this folder belongs to another study")
    write_text(path, text, keep_existing=True)
    got = load_profile(str(path))
    if got != want:
        raise StudyError(f"{path}: the written profile does not read back as intended")
    return got
