"""What the commands share: the subcommand maker, the options the lab's commands have in common
and their help texts, and the profile and run folder the options name."""

from __future__ import annotations

import argparse

from rlhf.config import DEFAULT_PROFILE, PROFILES, load_profile, override

PROFILE_HELP = f"profile name ({', '.join(PROFILES)}) or path to a profile TOML file"


def subcommand(sub, name: str, summary: str, description: str, example: str) -> argparse.ArgumentParser:
    """One subcommand: `summary` in `rlhf --help`, `description` and one example in its own --help."""
    return sub.add_parser(
        name,
        help=summary,
        description=description,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


PIN_HELP = (
    "keep the CPU arithmetic pinned for a BF16 profile on the CPU (by default such runs are unpinned: "
    "the pin caps oneDNN's BF16 matmuls at AVX2, tens of times slower, and no golden numbers exist for them)"
)
DTYPE_HELP = (
    "the dtype the base model computes in (default: its stored dtype, except BF16 weights on a CPU "
    "without native BF16 instructions, which compute in float32; run.json records the choice and why)"
)


def add_revision(p: argparse.ArgumentParser, default: str) -> None:
    """--revision, its default stated in its help from the one value argparse uses."""
    p.add_argument(
        "--revision", default=default, choices=["r001", "r002"],
        help=f"corpus revision: r001 (OfficeHelpPrefs-v1) or r002 (the corrected v2); default {default}",
    )  # fmt: skip


MODEL_DIR_HELP = (
    "the downloaded model folder (rlhf fetch-model) for the qwen2.5-0.5b profile; "
    "the embedded profile builds its own base and needs none"
)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options every command that runs the lab in a run folder shares."""
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.add_argument("--model-dir", default=None, help=MODEL_DIR_HELP)
    add_revision(p, "r001")
    p.add_argument("--pin", action="store_true", help=PIN_HELP)


def add_legs(p: argparse.ArgumentParser) -> None:
    """--legs: how the interrupt/resume protocol runs a training stage's three legs."""
    from rlhf.legs import LEGS, SEQUENTIAL, SIDE_BY_SIDE, default_legs

    p.add_argument(
        "--legs", choices=LEGS, default=default_legs(),
        help=f"{SIDE_BY_SIDE}: each training stage's continuous leg runs in a second process beside the "
        f"interrupted and resumed ones (same bytes, less wall time); {SEQUENTIAL}: one after the other. Default "
        f"here: {default_legs()} ({SIDE_BY_SIDE} with 2 or more cores, unless RLHF_LEGS={SEQUENTIAL})",
    )  # fmt: skip


def profile_of(args):
    """The profile named by --profile, with --dtype and --reward-design (where the command has
    them) written in."""
    profile = load_profile(args.profile)
    if getattr(args, "dtype", None):
        profile = override(profile, {("runtime", "compute_dtype"): args.dtype})
    if getattr(args, "reward_design", None):
        profile = override(profile, {("ppo", "reward_design"): args.reward_design})
    stops = getattr(args, "stop_on_warning", None)
    if stops is not None:  # the option given: with no names, any rule stops PPO
        profile = override(profile, {("ppo", "stop_on_warning"): True, ("ppo", "stop_signals"): tuple(stops)})
    return profile


def run_context(args):
    from rlhf.lab import open_context

    ctx = open_context(
        args.run if hasattr(args, "run") else args.out,
        profile_of(args) if hasattr(args, "dtype") else args.profile,
        getattr(args, "model_dir", None),
        getattr(args, "revision", "r001"),
    )
    if getattr(args, "legs", None):
        ctx.legs = args.legs
    return ctx
