"""Command line: `rlhf lab` (the main job) and one command per stage.

rlhf prepare --out DIR [--revision r001]     corpus: inputs/, labels/, manifest.json
rlhf build-embedded --out DIR [--seed 49] [--text office|control]   the embedded base (or its control)
rlhf fetch-model --out DIR                   download Qwen2.5-0.5B-Instruct (network needed)
rlhf sft|judge|ppo --run DIR [--resume] [--stop-after N]   one stage
rlhf evaluate --run DIR / rlhf report --run DIR
rlhf lab --out DIR [--profile embedded]      the whole lab in one run
rlhf lab --profile P --model-dir DIR --dry-run [--cpu]   every stage at tiny budgets, projected full times
rlhf base-study --out DIR                    the embedded base beside its control base
rlhf seeds --out DIR [--n 5] [--revision r001] [--workers W] [--sft-budget NAME]   the lab over N seeds
rlhf reproduce RESULTS_DIR --seed N [--work DIR]   one seed of a committed seed study, recomputed and compared
rlhf choose-sft-budget --out FILE.json --work DIR [--revision r002]   the SFT budget with room to help, validation only
rlhf choose-testbed --out FILE.json --work DIR [--round N]        a stable SFT with room to help, validation only
rlhf confirm-oracle --testbed FILE.json --out DIR   the testbed's room on test, on fresh seeds
rlhf choose-design --testbed FILE.json --out DIR    a design chosen on some seeds, estimated on fresh ones
rlhf confirm-design --choice FILE.json --out DIR    the answer on test, on a declared number of fresh seeds
rlhf nested --choice FILE.json --out DIR            variance split: PPO seeds nested in pipeline seeds
rlhf frontier --out DIR [--revision r002] [--n 3] [--confirm 5]   the over-optimisation frontier
rlhf export-verl --run DIR --out DIR [--nnodes M --gpus-per-node N --seeds K]   hand a finished run to verl
rlhf arithmetic [--out FILE] [--compare FILE]   this CPU's arithmetic fingerprint: do the golden numbers apply?
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from rlhf.cli.lab import (
    add_arithmetic,
    add_build_embedded,
    add_evaluate,
    add_export_verl,
    add_fetch_model,
    add_lab,
    add_prepare,
    add_report,
    add_stage,
)
from rlhf.cli.options import profile_of
from rlhf.cli.studies import (
    add_base_study,
    add_choose_design,
    add_choose_sft_budget,
    add_choose_testbed,
    add_compare_methods,
    add_confirm_design,
    add_confirm_methods,
    add_confirm_oracle,
    add_frontier,
    add_nested,
    add_reproduce,
    add_seeds,
)
from rlhf.config import load_profile
from rlhf.events import EventFolderError

__all__ = ["build_parser", "main", "profile_of"]


# The commands, in the order `rlhf --help` lists them: the lab and its stages, then the studies.
ADDERS = (
    add_prepare,
    add_build_embedded,
    add_fetch_model,
    add_stage,
    add_evaluate,
    add_report,
    add_lab,
    add_arithmetic,
    add_base_study,
    add_seeds,
    add_frontier,
    add_choose_sft_budget,
    add_choose_testbed,
    add_confirm_oracle,
    add_choose_design,
    add_confirm_design,
    add_nested,
    add_compare_methods,
    add_confirm_methods,
    add_reproduce,
    add_export_verl,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlhf",
        description=__doc__,
        epilog="Each command explains its options and shows an example: rlhf COMMAND --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from rlhf import __version__

    parser.add_argument("--version", action="version", version=f"rlhf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in ADDERS:
        add(sub)
    return parser


def _on_sigint(signum, frame) -> None:
    """First Ctrl-C: stop at the next checkpoint boundary; a second one stops at once."""
    from rlhf.checkpoint import request_stop, stop_requested

    if stop_requested():
        raise KeyboardInterrupt
    request_stop()
    print(
        "\nrlhf: stop requested: saving a checkpoint at the next boundary (Ctrl-C again to stop at once)",
        file=sys.stderr,
        flush=True,
    )


def _unpin_bf16_on_cpu(argv: list[str]) -> None:
    """A profile with BF16 weights on the CPU runs unpinned unless --pin: golden numbers exist for
    the embedded FP32 profile only, and the pin costs such a run its speed whichever dtype it
    computes in (capped at AVX2, oneDNN's BF16 matmuls are tens of times slower; MKL's compatible
    branch halved the full-width float32 vocabulary projection on an AMD EPYC Zen 3).

    Decided from the command line alone, before anything imports torch (building the full parser
    does): rlhf.runtime.release, recorded in the run's identity."""
    from rlhf import runtime

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--profile", default=None)
    pre.add_argument("--cpu", action="store_true")
    pre.add_argument("--pin", action="store_true")
    known, _ = pre.parse_known_args(argv)
    if known.profile is None or known.pin:
        return
    try:
        profile = load_profile(known.profile)
    except Exception:  # noqa: BLE001 - a bad profile is reported by the command itself
        return
    if profile.model.dtype == "bfloat16" and (profile.device == "cpu" or known.cpu):
        runtime.release(f"profile {profile.name} has BF16 weights and runs on the CPU (--pin keeps the pin)")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # bare `rlhf`: the commands, not an error
        build_parser().print_help()
        return 0
    _unpin_bf16_on_cpu(argv)
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGINT, _on_sigint)
    from rlhf.checkpoint import Interrupted

    try:
        return args.func(args)
    except Interrupted as stop:
        print(f"rlhf {args.command}: {stop}", file=sys.stderr)
        return 130
    except (
        FileExistsError,
        FileNotFoundError,
        ValueError,
        PermissionError,
        FloatingPointError,
        EventFolderError,
    ) as err:
        print(f"rlhf {args.command}: error: {err}", file=sys.stderr)
        return 2
