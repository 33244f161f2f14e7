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
rlhf choose-sft-budget --out FILE.json --work DIR [--revision r002]   the cut SFT budget, validation only
rlhf export-verl --run DIR --out DIR [--nnodes M --gpus-per-node N --seeds K]   hand a finished run to verl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from rlhf.config import DEFAULT_PROFILE, PROFILES, load_profile

PROFILE_HELP = f"profile name ({', '.join(PROFILES)}) or path to a profile TOML file"


def cmd_prepare(args) -> int:
    from rlhf.corpus import prepare

    manifest = prepare(args.out, revision=args.revision)
    print(json.dumps(manifest["audit"], indent=1, sort_keys=True))
    print(f"corpus written to {args.out}")
    return 0


def cmd_build_embedded(args) -> int:
    from rlhf.embedded import build_embedded

    manifest = build_embedded(args.out, seed=args.seed, text=args.text)
    print(
        f"embedded base ({manifest['text']} text): {manifest['parameters']:,} parameters, built in "
        f"{manifest['build_seconds']} s -> {args.out}"
    )
    return 0


def cmd_fetch_model(args) -> int:
    from rlhf.models import fetch_model

    profile = load_profile(args.profile)
    out = fetch_model(profile, args.out)
    print(f"downloaded {profile.model.repo_id}@{profile.model.revision} -> {out}")
    return 0


def _context(args):
    from rlhf.lab import open_context

    return open_context(
        args.run if hasattr(args, "run") else args.out,
        args.profile,
        getattr(args, "model_dir", None),
        getattr(args, "revision", "r001"),
    )


def cmd_stage(args) -> int:
    from rlhf import lab

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
    print(f"{args.command}: done in {result['seconds']:.1f} s -> {where}")
    return 0


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


def cmd_report(args) -> int:
    from rlhf.report import print_summary, write_reports

    paths = write_reports(args.run)
    print(print_summary(json.loads(Path(paths["results.json"]).read_text())))
    return 0


def cmd_lab(args) -> int:
    """prepare -> base -> SFT -> judge -> PPO (each with the interrupt/resume protocol) ->
    held-out evaluation and politeness exercise -> shortcut audit -> reports (rlhf.lab.run_lab).

    A stage that run.json records as complete is skipped; one that a crash interrupted
    continues from its last checkpoint."""
    from rlhf import lab
    from rlhf.report import print_summary

    if args.dry_run:
        return cmd_dry_run(args)
    if args.layers is not None or args.cpu or args.random_weights:
        raise ValueError("--layers, --cpu and --random-weights belong to --dry-run only")
    if args.out is None:
        raise ValueError("rlhf lab needs --out DIR (the run folder)")
    t0 = time.perf_counter()
    ctx = _context(args)
    arithmetic = json.loads((ctx.run / lab.RUN_FILE).read_text())["arithmetic"]
    print(f"arithmetic: {arithmetic['note']} ({arithmetic['cpu_capability']} kernels, {arithmetic['threads']} threads)")
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


def cmd_dry_run(args) -> int:
    """The miniature path (rlhf.miniature) on --model-dir in a throw-away folder, then the
    projected time of each full stage from the measured step times."""
    from rlhf.miniature import dry_run

    if args.model_dir is None:
        raise ValueError("--dry-run needs --model-dir DIR (the model the real run will use)")
    dry_run(
        load_profile(args.profile),
        args.model_dir,
        out=args.out,
        layers=args.layers,
        cpu=args.cpu,
        random_weights=args.random_weights,
    )
    return 0


def cmd_base_study(args) -> int:
    from rlhf.base_study import run_base_study, summary_lines

    result = run_base_study(args.out)
    print("\n".join(summary_lines(result)))
    for name, checks in result["verdict"].items():
        if name == result["chosen"]:
            print(
                f"{name}: "
                + ", ".join(f"{k} {v['value']:.3f} >= {v['at_least']}: {v['holds']}" for k, v in checks.items())
            )
    print(f"base study finished in {result['seconds']:.1f} s; everything is in {args.out}")
    return 0


def cmd_seeds(args) -> int:
    from rlhf.seeds import run_study

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


def cmd_choose_sft_budget(args) -> int:
    from rlhf.sft_budget import choose_sft_budget

    budgets = args.budgets.split(",") if args.budgets else None
    record = choose_sft_budget(
        args.out, args.work, revision=args.revision, profile_name=args.profile, budgets=budgets, previous=args.previous
    )
    print(f"chosen SFT budget: {record['chosen']} ({record['rule']}); written to {args.out}")
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlhf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="write the OfficeHelpPrefs corpus and its audit")
    p.add_argument("--out", required=True)
    p.add_argument("--revision", default="r001")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("build-embedded", help="build the embedded base model deterministically")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=49)
    p.add_argument(
        "--text",
        default="office",
        choices=["office", "control"],
        help="tokenizer text: office (the lab's base) or control (the base study's control base)",
    )
    p.set_defaults(func=cmd_build_embedded)

    p = sub.add_parser("fetch-model", help="download the pinned Qwen2.5-0.5B-Instruct revision")
    p.add_argument("--out", required=True)
    p.add_argument("--profile", default="qwen2.5-0.5b", choices=["qwen2.5-0.5b"])
    p.set_defaults(func=cmd_fetch_model)

    for name, text in (
        ("sft", "supervised fine-tuning of the actor"),
        ("judge", "train the judge (Bradley-Terry)"),
        ("ppo", "100-iteration PPO against the frozen judge"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--run", required=True, help="run folder (corpus, base model, stage outputs)")
        p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
        p.add_argument("--model-dir", default=None, help="local model directory (qwen2.5-0.5b)")
        p.add_argument("--revision", default="r001")
        p.add_argument("--resume", action="store_true", help="continue from the saved stop state")
        p.add_argument(
            "--stop-after",
            type=int,
            default=None,
            help="stop after this epoch (sft, judge) or iteration (ppo) and save a state",
        )
        if name == "ppo":
            p.add_argument("--no-kv-cache", action="store_true", help="generate without a KV cache")
        p.set_defaults(func=cmd_stage)

    for name, text, fn in (
        ("evaluate", "held-out generation, rubric, judge accuracy, politeness exercise", cmd_evaluate),
        ("report", "results.json, report.md and report.html of a run folder", cmd_report),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--run", required=True)
        if name == "evaluate":
            p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
            p.add_argument("--model-dir", default=None)
            p.add_argument("--revision", default="r001")
        p.set_defaults(func=fn)

    p = sub.add_parser("lab", help="the whole lab in one run")
    p.add_argument("--out", default=None, help="run folder (required; with --dry-run: default a new temporary folder)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.add_argument("--model-dir", default=None, help="local model directory (qwen2.5-0.5b)")
    p.add_argument("--revision", default="r001")
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
    p.set_defaults(func=cmd_lab)

    p = sub.add_parser("base-study", help="SFT on r001 and the judge on r002 for the embedded and control bases")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_base_study)

    from rlhf.sft_budget import SFT_BUDGETS

    p = sub.add_parser("seeds", help="the whole embedded lab over N training seeds, with across-seed statistics")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=5, help="number of training seeds (runs)")
    p.add_argument("--revision", default="r001", choices=["r001", "r002"])
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: the cores)")
    p.add_argument(
        "--sft-budget",
        default="full",
        choices=list(SFT_BUDGETS),
        help="named SFT budget (rlhf.sft_budget.SFT_BUDGETS; full: the profile's)",
    )
    p.add_argument("--study-seed", type=int, default=0, help="the one seed every run's training seeds derive from")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.set_defaults(func=cmd_seeds)

    p = sub.add_parser("choose-sft-budget", help="pick the cut SFT budget of question (b) on validation prompts only")
    p.add_argument("--out", required=True, help="JSON record of every candidate and the choice")
    p.add_argument("--work", required=True, help="folder for the corpus and the base model")
    p.add_argument("--revision", default="r002", choices=["r001", "r002"])
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=PROFILE_HELP)
    p.add_argument("--budgets", default=None, help="comma-separated budget names to measure (default: all)")
    p.add_argument(
        "--previous",
        action="append",
        default=[],
        help="an earlier record whose measured candidates are taken, not retrained (repeatable)",
    )
    p.set_defaults(func=cmd_choose_sft_budget)

    p = sub.add_parser("export-verl", help="hand a finished lab run to verl 0.9.1 (data, models, reward, launch)")
    p.add_argument("--run", required=True, help="finished run folder (run.json lists every stage complete)")
    p.add_argument("--out", required=True, help="new folder for the hand-off (never overwritten)")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="launch.sh runs this many seeds")
    p.add_argument("--profile", default=None, help="the run's profile file, when it was made with --profile PATH")
    p.add_argument("--model-dir", default=None, help="local model directory (qwen2.5-0.5b runs)")
    p.set_defaults(func=cmd_export_verl)
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


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGINT, _on_sigint)
    from rlhf.checkpoint import Interrupted

    try:
        return args.func(args)
    except Interrupted as stop:
        print(f"rlhf {args.command}: {stop}", file=sys.stderr)
        return 130
    except (FileExistsError, FileNotFoundError, ValueError, PermissionError, FloatingPointError) as err:
        print(f"rlhf {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
