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
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from rlhf import designs
from rlhf.config import DEFAULT_PROFILE, PROFILES, load_profile, override
from rlhf.events import EventFolderError, logdir_line
from rlhf.signals import SIGNALS, frozen_rules

PROFILE_HELP = f"profile name ({', '.join(PROFILES)}) or path to a profile TOML file"


def _command(sub, name: str, summary: str, description: str, example: str) -> argparse.ArgumentParser:
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
# Every declared design but the standardised judge, whose mean and SD are measured by the frontier study.
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


def _run_options(p: argparse.ArgumentParser) -> None:
    """The options every command that runs the lab in a run folder shares."""
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.add_argument("--model-dir", default=None, help=MODEL_DIR_HELP)
    add_revision(p, "r001")
    p.add_argument("--pin", action="store_true", help=PIN_HELP)


def cmd_prepare(args) -> int:
    from rlhf.corpus import prepare

    manifest = prepare(args.out, revision=args.revision)
    print(json.dumps(manifest["audit"], indent=1, sort_keys=True))
    print(f"corpus written to {args.out}")
    return 0


def add_prepare(sub) -> None:
    """`rlhf prepare`: its options, beside the command it runs."""
    p = _command(
        sub,
        "prepare",
        "write the OfficeHelpPrefs corpus and its audit",
        "Write the OfficeHelpPrefs corpus into a new folder: model inputs (inputs/), gold labels kept\n"
        "apart (labels/), and manifest.json with the audit and every file's hash. Prints the audit.",
        "rlhf prepare --out runs/corpus --revision r001",
    )
    p.add_argument("--out", required=True, help="new corpus folder (refused if it exists and is not empty)")
    add_revision(p, "r001")
    p.set_defaults(func=cmd_prepare)


def cmd_build_embedded(args) -> int:
    from rlhf.embedded import build_embedded

    manifest = build_embedded(args.out, seed=args.seed, text=args.text)
    print(
        f"embedded base ({manifest['text']} text): {manifest['parameters']:,} parameters, built in "
        f"{manifest['build_seconds']} s -> {args.out}"
    )
    return 0


def add_build_embedded(sub) -> None:
    """`rlhf build-embedded`: its options, beside the command it runs."""
    p = _command(
        sub,
        "build-embedded",
        "build the embedded base model deterministically",
        "Build the embedded base model (a 2-layer Qwen2ForCausalLM with its own byte-level BPE) into a\n"
        "new folder, in about a second. Two builds with the same seed and text are bit-identical.",
        "rlhf build-embedded --out runs/base_model",
    )
    p.add_argument("--out", required=True, help="new folder for the base model (must not exist)")
    p.add_argument("--seed", type=int, default=49, help="build seed of the weights and the tokenizer text (default 49)")
    p.add_argument(
        "--text",
        default="office",
        choices=["office", "control"],
        help="tokenizer text: office (the lab's base, the default) or control (the base study's control base)",
    )
    p.set_defaults(func=cmd_build_embedded)


def cmd_fetch_model(args) -> int:
    from rlhf.models import fetch_model

    profile = load_profile(args.profile)
    out = fetch_model(profile, args.out)
    print(f"downloaded {profile.model.repo_id}@{profile.model.revision} -> {out}")
    return 0


def add_fetch_model(sub) -> None:
    """`rlhf fetch-model`: its options, beside the command it runs."""
    p = _command(
        sub,
        "fetch-model",
        "download the pinned Qwen2.5-0.5B-Instruct revision",
        "Download Qwen2.5-0.5B-Instruct at the revision the profile pins, and record the SHA-256 of\n"
        "its files; the loader checks them on every later use. Needs network access to the model hub.",
        "rlhf fetch-model --out models/qwen2.5-0.5b-instruct",
    )
    p.add_argument("--out", required=True, help="folder to download into (must not exist or be empty)")
    p.add_argument(
        "--profile",
        default="qwen2.5-0.5b",
        choices=["qwen2.5-0.5b"],
        help="the profile whose model and revision to download (only qwen2.5-0.5b has one)",
    )
    p.set_defaults(func=cmd_fetch_model)


def cmd_arithmetic(args) -> int:
    """This machine's arithmetic fingerprint against the verified classes (rlhf.arithmetic)."""
    from rlhf import arithmetic
    from rlhf.io import write_json

    if args.out and Path(args.out).exists():
        raise FileExistsError(f"{args.out} exists; a fingerprint file is never overwritten (choose a new name)")
    other = arithmetic.load(args.compare) if args.compare else None  # refused before measuring
    fp = arithmetic.measure()
    print(arithmetic.report(fp, other, args.compare or ""))
    if args.out:
        write_json(args.out, fp)
        print(f"fingerprint written to {args.out}")
    return 0 if arithmetic.verdict(fp)["verified"] else 1


def add_arithmetic(sub) -> None:
    """`rlhf arithmetic`: its options, beside the command it runs."""
    p = _command(
        sub,
        "arithmetic",
        "this CPU's arithmetic fingerprint: do the golden numbers apply here?",
        "Measure this machine's arithmetic fingerprint (SHA-256 of the outputs of the CPU operations\n"
        "the embedded lab runs, under the pinned arithmetic) and compare it with the committed\n"
        "fingerprints of every CPU class the golden numbers were verified on, naming the first\n"
        "operation that differs. Exit status 0 when this machine belongs to a verified class, 1 when\n"
        "not. About 3 seconds.",
        "rlhf arithmetic --out my-cpu.json",
    )
    p.add_argument(
        "--out", default=None, help="also write this machine's fingerprint to this JSON file (never overwritten)"
    )
    p.add_argument(
        "--compare", default=None, help="also compare with another machine's fingerprint file (rlhf arithmetic --out)"
    )
    p.set_defaults(func=cmd_arithmetic)


def _profile(args):
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


def _context(args):
    from rlhf.lab import open_context

    return open_context(
        args.run if hasattr(args, "run") else args.out,
        _profile(args) if hasattr(args, "dtype") else args.profile,
        getattr(args, "model_dir", None),
        getattr(args, "revision", "r001"),
    )


def cmd_stage(args) -> int:
    from rlhf import lab

    lab.check_stop_after(load_profile(args.profile), args.command, args.stop_after)  # before the run folder
    if args.resume:
        lab.resumable_states(args.run, args.command)  # refused before the run folder is written
    ctx = _context(args)
    if args.stop_after is None and not args.resume and lab.stage_complete(ctx, args.command):
        print(f"{args.command}: already complete in {ctx.run} (run.json); nothing to do")
        return 0
    fn = {"sft": lab.stage_sft, "judge": lab.stage_judge, "ppo": lab.stage_ppo}[args.command]
    kwargs = {"resume": args.resume, "stop_after": args.stop_after}
    if args.command == "ppo":
        kwargs["use_cache"] = not args.no_kv_cache
    result = fn(ctx, **kwargs)
    where = ctx.run / args.command
    print(f"{args.command}: done in {result.seconds:.1f} s -> {where}")
    return 0


def add_stage(sub) -> None:
    """`rlhf sft`, `rlhf judge` and `rlhf ppo`: their options, beside the command they run."""
    for name, text, unit in (
        ("sft", "supervised fine-tuning of the actor", "epoch"),
        ("judge", "train the judge (Bradley-Terry)", "epoch"),
        ("ppo", "100-iteration PPO against the frozen judge", "iteration"),
    ):
        p = _command(
            sub,
            name,
            text,
            f"One stage of the lab: {text}.\n"
            "It runs in a run folder (its corpus and base are prepared there on first use; the stages\n"
            "run in the order sft, judge, ppo). A stage that run.json records as complete is skipped;\n"
            "after a crash, the same command continues from the last checkpoint.",
            f"rlhf {name} --run runs/lab --stop-after 1"
            if name != "ppo"
            else "rlhf ppo --run runs/lab --stop-after 40",
        )
        p.add_argument("--run", required=True, help="run folder (corpus, base model, stage outputs)")
        _run_options(p)
        p.add_argument("--resume", action="store_true", help="continue from the state saved by --stop-after")
        p.add_argument(
            "--stop-after",
            type=int,
            default=None,
            help=f"stop after this {unit} and save a state (continue later with --resume)",
        )
        if name == "ppo":
            p.add_argument(
                "--no-kv-cache", action="store_true", help="generate without a KV cache (same tokens, slower)"
            )
        p.set_defaults(func=cmd_stage)


STAGE_OUTPUTS = {
    "sft": "sft/actor.safetensors",
    "judge": "judge/judge.safetensors",
    "ppo": "ppo/actor.safetensors",
    "evaluate": "evaluation/results.json",
    "report": "report.html",
}


def cmd_evaluate(args) -> int:
    from rlhf.evaluate import stage_evaluate

    ctx = _context(args)
    stage_evaluate(ctx)
    print(f"evaluation written to {ctx.run / STAGE_OUTPUTS['evaluate']}")
    return 0


def add_evaluate(sub) -> None:
    """`rlhf evaluate`: its options, beside the command it runs."""
    p = _command(
        sub,
        "evaluate",
        "held-out generation, rubric, judge accuracy, politeness exercise",
        "Evaluate a run folder whose SFT, judge and PPO stages are complete: greedy answers of both\n"
        "policies on the held-out prompts, the rubric, the judge's test accuracy, bootstrap intervals\n"
        "and the politeness exercise, written to evaluation/results.json.",
        "rlhf evaluate --run runs/lab",
    )
    p.add_argument("--run", required=True, help="run folder whose training stages are complete")
    _run_options(p)
    p.set_defaults(func=cmd_evaluate)


def cmd_report(args) -> int:
    from rlhf.report import print_summary, write_reports

    paths = write_reports(args.run)
    print(print_summary(json.loads(Path(paths["results.json"]).read_text())))
    return 0


def add_report(sub) -> None:
    """`rlhf report`: its options, beside the command it runs."""
    p = _command(
        sub,
        "report",
        "results.json, report.md and report.html of a run folder",
        "Write results.json, report.md and report.html of a run folder from what its stages wrote,\n"
        "and print the summary table.",
        "rlhf report --run runs/lab",
    )
    p.add_argument("--run", required=True, help="run folder with its evaluation written")
    p.set_defaults(func=cmd_report)


def cmd_lab(args) -> int:
    """prepare -> base -> SFT -> judge -> PPO (each with the interrupt/resume protocol) ->
    held-out evaluation and politeness exercise -> shortcut audit -> reports (rlhf.lab.run_lab).

    A stage that run.json records as complete is skipped; one that a crash interrupted
    continues from its last checkpoint."""
    from rlhf import events, lab
    from rlhf.arithmetic import golden_line
    from rlhf.models import precision_line
    from rlhf.report import print_summary

    if args.dry_run:
        return cmd_dry_run(args)
    if args.layers is not None or args.cpu or args.random_weights:
        raise ValueError("--layers, --cpu and --random-weights belong to --dry-run only")
    if args.out is None:
        raise ValueError("rlhf lab needs --out DIR (the run folder)")
    t0 = time.perf_counter()
    ctx = _context(args)
    print(logdir_line(ctx.run / events.FOLDER), flush=True)
    arithmetic = json.loads((ctx.run / lab.RUN_FILE).read_text())["arithmetic"]
    print(f"arithmetic: {arithmetic['note']} ({arithmetic['cpu_capability']} kernels, {arithmetic['threads']} threads)")
    print(precision_line(ctx.precision))
    print(golden_line(ctx.profile))
    print(f"corpus {ctx.corpus.dataset} {ctx.corpus.revision} audit:")
    print(json.dumps(ctx.corpus.manifest["audit"], indent=1, sort_keys=True))
    n = sum(p.numel() for p in ctx.role("reference").model.parameters())
    print(
        f"base model: {ctx.profile.name} from {ctx.model_dir}: {n:,} parameters with adapters, "
        f"vocab {len(ctx.tokenizer)}, EOS {ctx.eos_id}, PAD {ctx.pad_id}"
    )
    results = lab.run_lab(ctx)
    print(print_summary(results))
    audit = results.get("shortcut_audit")
    if audit:
        pairs = audit["counterfactuals"][audit["baseline"]]["pairs"]
        print(
            f"shortcut audit (judge accuracy on the {pairs} test pairs): "
            + ", ".join(f"{k} {audit['counterfactuals'][k]['accuracy']:.3f}" for k in audit["order"])
        )
    print(f"lab finished in {time.perf_counter() - t0:.1f} s; everything is in {ctx.run}")
    return 0


def add_lab(sub) -> None:
    """`rlhf lab`: its options, beside the command it runs."""
    p = _command(
        sub,
        "lab",
        "the whole lab in one run",
        "The whole lab in one run folder: corpus, base model, SFT, judge, PPO (each with the\n"
        "interrupt/resume protocol), held-out evaluation and politeness exercise, shortcut audit,\n"
        "reports. A rerun of the same command after a crash continues where the run stopped.\n"
        "\n"
        "With --dry-run: every stage at tiny budgets in a throw-away folder, then the projected time\n"
        "of each full stage on this machine, e.g.\n"
        "  rlhf lab --profile qwen2.5-0.5b --model-dir models/qwen2.5-0.5b-instruct --dry-run",
        "rlhf lab --out runs/lab",
    )
    p.add_argument("--out", default=None, help="run folder (required; with --dry-run: default a new temporary folder)")
    _run_options(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="every stage at tiny budgets (rlhf.miniature) in a throw-away folder, then the projected "
        "time of each full stage on this machine",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="--dry-run only: run a CUDA profile's miniature on the CPU on purpose (recorded in run.json)",
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help="--dry-run only: the model directory holds only this many of the profile's layers",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="--dry-run only: accept a random-weight model directory (rlhf.models.write_random_model_dir)",
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help=DTYPE_HELP)
    p.add_argument(
        "--reward-design",
        choices=designs.LAB_OPTIONS,
        default=None,
        help="what PPO pays at an answer's last token, written into the run's profile ([ppo] reward_design): "
        + "; ".join(
            f"'{name}'" + (" (the default)" if name == designs.DEFAULT else "") + f": {designs.label(name)}"
            for name in designs.LAB_OPTIONS
        ),
    )
    ruled = {rule.signal for rule in frozen_rules()[0]}
    stoppers = [s for s in SIGNALS if s in ruled]  # a signal without a frozen rule could never stop PPO
    p.add_argument(
        "--stop-on-warning",
        nargs="*",
        metavar="SIGNAL",
        choices=stoppers,
        default=None,
        help="stop PPO after the first iteration where a frozen over-optimisation warning rule fires "
        "(rlhf/warning_rules.json; [ppo] stop_on_warning, part of the run's identity); with SIGNAL names "
        f"({', '.join(stoppers)}: the signals with a frozen rule), only those signals' rules stop it "
        "([ppo] stop_signals). Without the option a warning is printed and changes nothing",
    )
    p.set_defaults(func=cmd_lab)


def cmd_dry_run(args) -> int:
    """The miniature path (rlhf.miniature) on --model-dir in a throw-away folder, then the
    projected time of each full stage from the measured step times."""
    from rlhf.miniature import dry_run

    profile = _profile(args)
    if args.model_dir is None and profile.model.kind != "embedded":
        raise ValueError("--dry-run needs --model-dir DIR (the model the real run will use)")
    dry_run(
        profile,
        args.model_dir,
        out=args.out,
        layers=args.layers,
        cpu=args.cpu,
        random_weights=args.random_weights,
    )
    return 0


def cmd_base_study(args) -> int:
    from rlhf.studies.base import run_base_study, summary_lines

    result = run_base_study(args.out, reuse=args.reuse)
    print("\n".join(summary_lines(result)))
    for name, checks in result["verdict"].items():
        if name == result["chosen"]:
            print(
                f"{name}: "
                + ", ".join(f"{k} {v['value']:.3f} >= {v['at_least']}: {v['holds']}" for k, v in checks.items())
            )
    print(f"base study finished in {result['seconds']:.1f} s; everything is in {args.out}")
    return 0


def add_base_study(sub) -> None:
    """`rlhf base-study`: its options, beside the command it runs."""
    p = _command(
        sub,
        "base-study",
        "SFT on r001 and the judge on r002 for the embedded and control bases",
        "Can the embedded base carry an SFT actor and a judge that reads the situation? Measures SFT\n"
        "on r001 and the judge on r002 with the profile's budgets, for the embedded base and for a\n"
        "control base, and checks the bounds fixed before measuring (about 2.5 minutes).",
        "rlhf base-study --out runs/base_study --reuse runs/lab",
    )
    p.add_argument("--out", required=True, help="study folder (refused if it already holds results.json)")
    p.add_argument(
        "--reuse",
        action="append",
        metavar="RUN",
        help="a finished lab run (r001 or r002; repeatable) whose SFT or judge the embedded base's measurement "
        "takes instead of training it again, when the run trained it from the same inputs (checked)",
    )
    p.set_defaults(func=cmd_base_study)


def cmd_seeds(args) -> int:
    from rlhf.studies.seeds import run_study

    t0 = time.perf_counter()
    result = run_study(
        args.out,
        n=args.n,
        revision=args.revision,
        workers=args.workers,
        sft_budget=args.sft_budget,
        study_seed=args.study_seed,
        profile_name=args.profile,
    )
    for key in ("rubric_success.test", "rubric_success.all_unique_contexts"):
        s = result["across"][f"{key}.ppo_minus_sft"]
        print(
            f"PPO - SFT {key}: mean {s['mean']:+.3f}, SD {s['sd']:.3f}, 95% t-interval over {s['n']} seeds "
            f"[{s['t95'][0]:+.3f}, {s['t95'][1]:+.3f}], positive in {s['positive']} of {s['n']}"
        )
    print(f"seeds finished in {time.perf_counter() - t0:.1f} s; {args.out}/seeds.json and {args.out}/report.html")
    return 0


def add_seeds(sub) -> None:
    """`rlhf seeds`: its options, beside the command it runs."""
    from rlhf.studies.derivation import SFT_RECIPES

    p = _command(
        sub,
        "seeds",
        "the whole embedded lab over N training seeds, with across-seed statistics",
        "The whole lab N times, every training seed of run i derived from the profile's value +\n"
        "100000 x study seed + 1000 x i; run 0 of study seed 0 is the profile's single run. Writes\n"
        "DIR/seeds.json (per run and across runs: mean, SD, 95% t-interval over seeds, sign counts)\n"
        "and DIR/report.html. A killed study continues on rerun; a finished one recomputes nothing.",
        "rlhf seeds --out runs/seeds-r001 --n 5 --revision r001 --workers 2",
    )
    p.add_argument(
        "--out", required=True, help="study folder: one run folder per seed (seed-i/), seeds.json, report.html"
    )
    p.add_argument("--n", type=int, default=5, help="number of training seeds (runs), default 5")
    add_revision(p, "r001")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: the cores)")
    p.add_argument(
        "--sft-budget",
        default="full",
        choices=SFT_RECIPES,
        help="named SFT budget or recipe (full: the profile's; sft-eK: K epochs; sft-lrX: peak rate X; sft-demosN: N "
        "demonstrations; rlhf.studies.derivation)",
    )
    p.add_argument("--study-seed", type=int, default=0, help="the one seed every run's training seeds derive from")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.set_defaults(func=cmd_seeds)


def cmd_reproduce(args) -> int:
    from rlhf.studies.reproduce import reproduce

    out = reproduce(args.results, args.seed, args.work, profile_name=args.profile)
    if out["identical"]:
        print(
            f"seed {args.seed} of {args.results}: recomputed in {out['seconds']:.0f} s, byte for byte the committed row"
        )
        return 0
    print(f"seed {args.seed} of {args.results} differs from the committed row: {out['first_difference']}")
    return 1


def add_reproduce(sub) -> None:
    """`rlhf reproduce`: its options, beside the command it runs."""
    p = _command(
        sub,
        "reproduce",
        "recompute one seed of a committed seed study and compare its row byte for byte",
        "Run `rlhf lab` on seed N's run profile of the seed study in RESULTS_DIR (rlhf seeds) with\n"
        "today's code, and compare its row with the committed one in canonical JSON: exit 0 when they\n"
        "are the same bytes, 1 naming the first difference. Same CPU arithmetic expected (the CPU\n"
        "pin; `rlhf arithmetic` says whether this machine computes like the verified ones).",
        "rlhf reproduce results/seeds-r001 --seed 0 --work runs/reproduce-r001-0",
    )
    p.add_argument("results", help="the committed study's folder (its study.json and seeds.json)")
    p.add_argument("--seed", type=int, required=True, help="the run of the study to recompute (0 to n - 1)")
    p.add_argument("--work", default=None, help="the run folder's parent (default: a new temporary folder)")
    p.add_argument("--profile", default=None, help="the profile file of a study made with one (default: the study's)")
    p.set_defaults(func=cmd_reproduce)


def cmd_frontier(args) -> int:
    t0 = time.perf_counter()
    if args.summarise_to:
        from rlhf.studies.frontier.study import summarise_to

        summarise_to(args.out, args.summarise_to)
        return 0
    if args.choose_warnings:
        from rlhf.studies.warnings import choose_rules

        record = choose_rules(args.out, args.choose_warnings)
        for r in record["rules"]:
            rule = "never defined" if r["threshold"] is None else f">= {r['threshold']:.4g} for {r['patience']}"
            print(f"  {r['signal']}: {rule}")
        return 0
    if args.confirm is not None:
        from rlhf.report.frontier import point_where
        from rlhf.studies.frontier.confirmation import run_confirmation

        record = run_confirmation(args.out, n=args.confirm, workers=args.workers)
        for p in record["points"]:
            s = p["across"]["rubric_success.test.ppo_minus_sft"]
            print(
                f"{p['arm']} {point_where(p)}: PPO - SFT test rubric success mean {s['mean']:+.3f}, "
                f"95% t-interval over {s['n']} seeds [{s['t95'][0]:+.3f}, {s['t95'][1]:+.3f}], "
                f"positive in {s['positive']} of {s['n']}"
            )
        print(
            f"confirmation finished in {time.perf_counter() - t0:.1f} s; "
            f"{args.out}/confirmation.json and {args.out}/confirmation.html"
        )
        return 0
    from rlhf.studies.frontier.arms import Settings, default_arms, parse_grid
    from rlhf.studies.frontier.study import run_frontier

    result = run_frontier(
        args.out,
        n=args.n,
        revision=args.revision,
        sft_budget=args.sft_budget,
        workers=args.workers,
        profile_name=args.profile,
        settings=Settings(arms=default_arms(parse_grid(args.grid))),
    )
    sel = result["selection"]
    print(
        f"chosen on validation: {sel['arm']} at iteration {sel['iteration']}, mean validation rubric success "
        f"{sel['mean_validation_gold']:.3f} (SFT {sel['sft_mean_validation_gold']:.3f})"
    )
    print(f"frontier finished in {time.perf_counter() - t0:.1f} s; {args.out}/frontier.json and {args.out}/report.html")
    return 0


def add_frontier(sub) -> None:
    """`rlhf frontier`: its options, beside the command it runs."""
    from rlhf.studies.derivation import SFT_RECIPES

    p = _command(
        sub,
        "frontier",
        "the over-optimisation frontier: gold and learned reward against sqrt(KL), chosen on validation",
        "Per training seed: SFT and the judge once, then PPO arms from that SFT (the SPEC's KL\n"
        "coefficient 0.02, a grid c x sigma of the judge's spread, an oracle control, the iterated judge\n"
        "and a worst-case judge ensemble at 0.02 and at the grid's best c), every checkpoint and\n"
        "best-of-n measured on the validation prompts. Writes DIR/frontier.json and DIR/report.html\n"
        "with the best (arm, iteration). --confirm N then runs that point and the SPEC's default on N\n"
        "fresh seeds and evaluates them on test (DIR/confirmation.json, DIR/confirmation.html).\n"
        "--choose-warnings FILE chooses an over-optimisation warning rule per signal on the finished\n"
        "study and freezes them into FILE. A killed study continues on rerun; a finished one\n"
        "recomputes nothing.",
        "rlhf frontier --out runs/frontier-r002 --n 3 --workers 2\nrlhf frontier --out runs/frontier-r002 --confirm 5",
    )
    p.add_argument(
        "--out", required=True, help="study folder: seed-i/ (its arms in seed-i/arms/), frontier.json, report.html"
    )
    p.add_argument("--n", type=int, default=3, help="number of training seeds, default 3")
    add_revision(p, "r002")
    p.add_argument(
        "--sft-budget",
        default="sft-e6",
        choices=SFT_RECIPES,
        help="named SFT budget (default sft-e6, the budget rlhf choose-sft-budget chose for r002; full: the profile's)",
    )
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: the cores)")
    p.add_argument(
        "--grid",
        default=None,
        metavar="C1,C2,...",
        help="the KL coefficients in units of the judge's spread (beta = c sigma; default 0.01,0.02,0.05,0.1,0.2,"
        "0.5,1,2,5). A study run before with fewer grid values is extended: its arms are kept and only the new ones "
        "run (and the arms at the grid's best c again, if the best moved)",
    )
    p.add_argument(
        "--confirm",
        type=int,
        default=None,
        metavar="N",
        help="after the study: run the chosen point and the SPEC's default on N fresh seeds, on test",
    )
    p.add_argument(
        "--summarise-to",
        metavar="NEWDIR",
        help="write the summary of a finished study (frontier.json, report.html, the confirmation's) into a new "
        "folder, recomputed from its stored measurements by this code; nothing is trained or measured",
    )
    p.add_argument(
        "--choose-warnings",
        metavar="FILE",
        help="after the study: choose one warning rule per over-optimisation signal on its runs and freeze them "
        "into the new FILE (rlhf/warning_rules.json is the committed one every summary scores)",
    )
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.set_defaults(func=cmd_frontier)


def cmd_choose_sft_budget(args) -> int:
    from rlhf.studies.sft_budget import choose_sft_budget

    budgets = args.budgets.split(",") if args.budgets else None
    record = choose_sft_budget(
        args.out,
        args.work,
        revision=args.revision,
        profile_name=args.profile,
        budgets=budgets,
        previous=args.previous,
        workers=args.workers,
    )
    chosen = record["chosen"] or "none: no budget qualifies (the record shows each one's oracle gain)"
    print(f"chosen SFT budget: {chosen} ({record['rule']}); written to {args.out}")
    return 0


def add_choose_sft_budget(sub) -> None:
    """`rlhf choose-sft-budget`: its options, beside the command it runs."""
    p = _command(
        sub,
        "choose-sft-budget",
        "pick the SFT budget where PPO has room to help, on validation prompts only",
        "Pick the SFT budget on validation prompts only: the smallest named budget (1 to 10 epochs)\n"
        "whose SFT greedy validation success (mean of the frontier's 3 seeds) lies in [0.1, 0.7] and\n"
        "where the oracle control raises that by at least 0.10 (a frontier study of the oracle arm\n"
        "in WORK/frontier-BUDGET). Writes every measured budget and the choice to a JSON record.",
        "rlhf choose-sft-budget --out runs/sft-budget-r002.json --work runs/sft-budget-r002-work --revision r002",
    )
    p.add_argument("--out", required=True, help="JSON record of every candidate and the choice")
    p.add_argument(
        "--work", required=True, help="folder for the corpus, the base model and the oracle control's studies"
    )
    add_revision(p, "r002")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.add_argument("--budgets", default=None, help="comma-separated budget names to measure (default: all)")
    p.add_argument(
        "--previous",
        action="append",
        default=[],
        help="an earlier record whose SFT measurements are taken, not retrained (repeatable)",
    )
    p.add_argument(
        "--workers", type=int, default=None, help="worker processes of the oracle studies (default: one per core)"
    )
    p.set_defaults(func=cmd_choose_sft_budget)


def cmd_confirm_oracle(args) -> int:
    from rlhf.studies.room import confirm_oracle

    record = confirm_oracle(args.testbed, args.out, workers=args.workers, replicate=args.replicate)
    print(f"room shown on test: {'yes' if record['room_shown'] else 'no'}; written to {Path(args.out) / 'room.json'}")
    return 0


def add_confirm_oracle(sub) -> None:
    """`rlhf confirm-oracle`: its options, beside the command it runs."""
    from rlhf.studies.heldout import CAP, HALF_WIDTH
    from rlhf.studies.room import REPLICATION_STUDY_SEED, ROOM_STUDY_SEED

    p = _command(
        sub,
        "confirm-oracle",
        "the testbed's room on test: the oracle control against SFT on fresh seeds",
        textwrap.fill(
            f"Show the chosen testbed's room on test (rlhf.studies.room): first DIR/study.json declares, from "
            f"the testbed record alone, the oracle's checkpoint and the seed count of the power rule (95% "
            f"half-width at most {HALF_WIDTH} from the oracle's per-seed validation gains, at most {CAP} seeds); "
            f"then that many fresh seeds (study seed {ROOM_STUDY_SEED}) train SFT, the judge and the oracle arm, "
            f"and each seed's SFT and oracle are evaluated on test. DIR/room.json: per seed oracle - SFT, the "
            f"mean, the Student-t interval, the exact sign-flip p. Where the rule chose no testbed, the nearest "
            f"candidate (stable, the largest oracle gain on validation) is confirmed and study.json says it does "
            f"not qualify. A stopped study continues when rerun.",
            width=100,
            break_on_hyphens=False,
        ),
        "rlhf confirm-oracle --testbed results/testbed-r002-2/testbed-r002-2.json --out runs/room-r002 --workers 2",
    )
    p.add_argument(
        "--testbed",
        required=True,
        help="the testbed record (rlhf choose-testbed) whose choice (or nearest candidate) to confirm",
    )
    p.add_argument("--out", required=True, help="study folder (study.json, the declaration, first; room.json last)")
    p.add_argument(
        "--replicate",
        default=None,
        metavar="ROOM_JSON",
        help=f"repeat a finished room study on fresh seeds (study seed {REPLICATION_STUDY_SEED}), as many as the "
        "power rule asks for its per-seed test spread",
    )
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.set_defaults(func=cmd_confirm_oracle)


def cmd_choose_design(args) -> int:
    from rlhf.studies.choice import choose_design

    record = choose_design(args.testbed, args.out, workers=args.workers)
    c = record["chosen"]
    print(f"chosen: {c['arm']} at iteration {c['iteration']}; written to {Path(args.out) / 'choice.json'}")
    return 0


def add_choose_design(sub) -> None:
    """`rlhf choose-design`: its options, beside the command it runs."""
    from rlhf.studies.choice import CANDIDATES, CHECKPOINTS, ESTIMATION_SEEDS, ESTIMATION_STUDY_SEED, SELECTION_SEEDS

    p = _command(
        sub,
        "choose-design",
        "choose a design on some validation seeds and estimate it on fresh ones (no winner's curse)",
        textwrap.fill(
            f"Choose the operating point on the chosen testbed (where none qualified, the nearest one, said so in "
            f"study.json; rlhf.studies.choice), on validation prompts "
            f"only: among the declared candidates ({', '.join(CANDIDATES)}) at the declared checkpoints "
            f"({', '.join(map(str, CHECKPOINTS))}), the point with the best mean validation gold over "
            f"{SELECTION_SEEDS} selection seeds (DIR/selection); then its gain over SFT and over the SPEC's "
            f"default estimated on {ESTIMATION_SEEDS} fresh seeds (study seed {ESTIMATION_STUDY_SEED}, "
            f"DIR/estimation). DIR/choice.json: the choice, the naive and the honest estimates, the prompt sets "
            f"and commit of each step. A stopped study continues when rerun.",
            width=100,
            break_on_hyphens=False,
        ),
        "rlhf choose-design --testbed results/testbed-r002-2/testbed-r002-2.json --out runs/choice-r002 --workers 2",
    )
    p.add_argument("--testbed", required=True, help="the testbed record (rlhf choose-testbed) whose SFT recipe to use")
    p.add_argument("--out", required=True, help="study folder (study.json, the declaration, first; choice.json last)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.set_defaults(func=cmd_choose_design)


def cmd_confirm_design(args) -> int:
    from rlhf.studies.verdict import confirm_design

    confirm_design(args.choice, args.out, workers=args.workers)
    print(f"written to {Path(args.out) / 'verdict.json'}")
    return 0


def add_confirm_design(sub) -> None:
    """`rlhf confirm-design`: its options, beside the command it runs."""
    from rlhf.studies.heldout import CAP, HALF_WIDTH
    from rlhf.studies.verdict import VERDICT_STUDY_SEED

    p = _command(
        sub,
        "confirm-design",
        "the answer on test: the chosen design, the SPEC default and the oracle on declared fresh seeds",
        textwrap.fill(
            f"Read the declared comparisons on test (rlhf.studies.verdict): first DIR/study.json declares, from "
            f"the choice record alone, the points (the chosen design at its checkpoint, the SPEC's default at "
            f"its last iteration, the oracle at the testbed's checkpoint), the comparisons (chosen - SFT, chosen "
            f"- default paired by seed, oracle - SFT) and the seed count of the power rule (95% half-width at "
            f"most {HALF_WIDTH} from each comparison's validation spread, at most {CAP} seeds); then that many "
            f"fresh seeds (study seed {VERDICT_STUDY_SEED}) are trained and evaluated on test. DIR/verdict.json: "
            f"each comparison's mean, Student-t interval, exact sign-flip p and seeds up. A stopped study "
            f"continues when rerun.",
            width=100,
            break_on_hyphens=False,
        ),
        "rlhf confirm-design --choice runs/choice-r002/choice.json --out runs/verdict-r002 --workers 2",
    )
    p.add_argument("--choice", required=True, help="the choice record (rlhf choose-design) whose point to confirm")
    p.add_argument("--out", required=True, help="study folder (study.json, the declaration, first; verdict.json last)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.set_defaults(func=cmd_confirm_design)


def cmd_nested(args) -> int:
    from rlhf.studies.nested import run_nested

    run_nested(args.choice, args.out, workers=args.workers)
    print(f"written to {Path(args.out) / 'nested.json'}")
    return 0


def add_nested(sub) -> None:
    """`rlhf nested`: its options, beside the command it runs."""
    from rlhf.studies.nested import NESTED_STUDY_SEED, PIPELINES, PPO_SEEDS

    p = _command(
        sub,
        "nested",
        "variance split by source: PPO seeds nested in pipeline seeds, read on test",
        textwrap.fill(
            f"Split the variance of each declared comparison with SFT by its source (rlhf.studies.nested): "
            f"{PIPELINES} pipeline seeds (study seed {NESTED_STUDY_SEED}: data order, SFT, judge) each run PPO "
            f"with {PPO_SEEDS} PPO seeds for the SPEC's default, the chosen design and the oracle at the "
            f"verdict's points, read on test against the pipeline's SFT. DIR/nested.json: the variance from "
            f"PPO seeds, from pipeline seeds and from the test prompts, and the intervals 'from one SFT and "
            f"judge' and 'over the whole pipeline'. A stopped study continues when rerun.",
            width=100,
            break_on_hyphens=False,
        ),
        "rlhf nested --choice runs/choice-r002/choice.json --out runs/nested-r002 --workers 2",
    )
    p.add_argument("--choice", required=True, help="the choice record (rlhf choose-design) naming the points")
    p.add_argument("--out", required=True, help="study folder (study.json, the declaration, first; nested.json last)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.set_defaults(func=cmd_nested)


def cmd_choose_testbed(args) -> int:
    from rlhf.studies.testbed import choose_testbed

    record = choose_testbed(
        args.out, args.work, revision=args.revision, profile_name=args.profile, workers=args.workers,
        round_number=args.round,
    )  # fmt: skip
    chosen = record["chosen"] or "none: no candidate qualifies (the record shows each one's SFT spread and oracle gain)"
    print(f"chosen testbed: {chosen}; written to {args.out}")
    return 0


def add_choose_testbed(sub) -> None:
    """`rlhf choose-testbed`: its options, beside the command it runs."""
    from rlhf.studies.testbed import GAIN, LATEST, MAX_SD, MIN_SHARE, ORACLE_SEEDS, ROUNDS, SEEDS

    r = ROUNDS[LATEST]
    p = _command(
        sub,
        "choose-testbed",
        "pick the SFT recipe that is stable across seeds and leaves PPO room, on validation prompts only",
        textwrap.fill(
            f"Pick the testbed's SFT on validation prompts only (rlhf.studies.testbed), by the rule of a "
            f"declared round (latest: {LATEST}): every candidate of the round (round {LATEST}: "
            f"{', '.join(r.candidates)}) trained with {SEEDS} seeds; those whose greedy validation success has a "
            f"mean in the round's band (round {LATEST}: [{r.low}, {r.high}]), an SD of at most {MAX_SD} and no "
            f"seed below {MIN_SHARE} x the mean get the oracle control on the first {ORACLE_SEEDS} seeds (a "
            f"frontier study of the oracle arm in WORK/oracle-CANDIDATE); the one whose oracle gains most, at "
            f"least {GAIN}, is chosen. Writes every candidate's table and the choice to a JSON record. A stopped "
            f"run continues when rerun (each SFT's row is kept in WORK/sft/).",
            width=100,
            break_on_hyphens=False,
        ),
        "rlhf choose-testbed --out runs/testbed-r002-2.json --work runs/testbed-r002-2-work --workers 2",
    )
    p.add_argument(
        "--round", type=int, default=LATEST, choices=sorted(ROUNDS),
        help=f"the declared round whose candidates and band to use (default {LATEST}, the latest)",
    )  # fmt: skip
    p.add_argument("--out", required=True, help="JSON record of every candidate and the choice")
    p.add_argument("--work", required=True, help="folder for the corpus, the base model, SFT rows and oracle studies")
    add_revision(p, "r002")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.set_defaults(func=cmd_choose_testbed)


def cmd_export_verl(args) -> int:
    from rlhf.export_verl import export_verl

    manifest = export_verl(
        args.run,
        args.out,
        nnodes=args.nnodes,
        gpus_per_node=args.gpus_per_node,
        seeds=args.seeds,
        profile=args.profile,
        model_dir=args.model_dir,
    )
    print(
        f"verl hand-off of {args.run} ({len(manifest['files'])} files) -> {args.out}; "
        f"launch with: bash {Path(args.out) / 'launch' / 'launch.sh'}"
    )
    return 0


def add_export_verl(sub) -> None:
    """`rlhf export-verl`: its options, beside the command it runs."""
    p = _command(
        sub,
        "export-verl",
        "hand a finished lab run to verl 0.9.1 (data, models, reward, launch)",
        "Write a self-contained verl 0.9.1 hand-off of a finished run into a new folder: data/\n"
        "(parquet prompts, preference pairs, demonstrations), models/ (merged SFT actor, critic\n"
        "initialisation, judge), reward/, launch/ (Hydra overrides, launch.sh, mapping.json) and\n"
        "manifest.json. Written whole or not at all. See docs/scaling-out.md.",
        "rlhf export-verl --run runs/lab --out handoff --nnodes 2 --gpus-per-node 8 --seeds 3",
    )
    p.add_argument("--run", required=True, help="finished run folder (run.json lists every stage complete)")
    p.add_argument("--out", required=True, help="new folder for the hand-off (never overwritten)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes of the verl launch (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="GPUs per node of the verl launch (default 1)")
    p.add_argument("--seeds", type=int, default=1, help="launch.sh runs this many seeds (default 1)")
    p.add_argument("--profile", default=None, help="the run's profile file, when it was made with --profile PATH")
    p.add_argument("--model-dir", default=None, help="local model directory (qwen2.5-0.5b runs)")
    p.set_defaults(func=cmd_export_verl)


# The commands, in the order `rlhf --help` lists them: the lab and its stages, then the studies.
ADDERS = (
    add_prepare, add_build_embedded, add_fetch_model, add_stage, add_evaluate, add_report, add_lab, add_arithmetic,
    add_base_study, add_seeds, add_frontier, add_choose_sft_budget, add_choose_testbed, add_confirm_oracle,
    add_choose_design, add_confirm_design, add_nested, add_reproduce, add_export_verl,
)  # fmt: skip


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


if __name__ == "__main__":
    sys.exit(main())
