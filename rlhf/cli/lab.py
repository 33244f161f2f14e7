"""The lab's commands: the corpus, the base models, the arithmetic check, each stage, the
evaluation, the report, `rlhf lab` (and its dry run) and the hand-over to verl."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlhf import designs
from rlhf.cli.options import (
    DTYPE_HELP,
    add_legs,
    add_revision,
    add_run_options,
    profile_of,
    run_context,
    subcommand,
)
from rlhf.config import load_profile
from rlhf.events import logdir_line
from rlhf.signals import SIGNALS, frozen_rules


def cmd_prepare(args) -> int:
    from rlhf.corpus import prepare

    manifest = prepare(args.out, revision=args.revision)
    print(json.dumps(manifest["audit"], indent=1, sort_keys=True))
    print(f"corpus written to {args.out}")
    return 0


def add_prepare(sub) -> None:
    """`rlhf prepare`: its options, beside the command it runs."""
    p = subcommand(
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
    p = subcommand(
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
    p = subcommand(
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
    p = subcommand(
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


def cmd_stage(args) -> int:
    from rlhf import lab

    lab.check_stop_after(load_profile(args.profile), args.command, args.stop_after)  # before the run folder
    if args.resume:
        lab.resumable_states(args.run, args.command)  # refused before the run folder is written
    ctx = run_context(args)
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
        p = subcommand(
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
        add_run_options(p)
        add_legs(p)
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

    ctx = run_context(args)
    stage_evaluate(ctx)
    print(f"evaluation written to {ctx.run / STAGE_OUTPUTS['evaluate']}")
    return 0


def add_evaluate(sub) -> None:
    """`rlhf evaluate`: its options, beside the command it runs."""
    p = subcommand(
        sub,
        "evaluate",
        "held-out generation, rubric, judge accuracy, politeness exercise",
        "Evaluate a run folder whose SFT, judge and PPO stages are complete: greedy answers of both\n"
        "policies on the held-out prompts, the rubric, the judge's test accuracy, bootstrap intervals\n"
        "and the politeness exercise, written to evaluation/results.json.",
        "rlhf evaluate --run runs/lab",
    )
    p.add_argument("--run", required=True, help="run folder whose training stages are complete")
    add_run_options(p)
    p.set_defaults(func=cmd_evaluate)


def cmd_report(args) -> int:
    from rlhf.report import print_summary, write_reports

    paths = write_reports(args.run)
    print(print_summary(json.loads(Path(paths["results.json"]).read_text())))
    return 0


def add_report(sub) -> None:
    """`rlhf report`: its options, beside the command it runs."""
    p = subcommand(
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
    ctx = run_context(args)
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
    p = subcommand(
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
    add_run_options(p)
    add_legs(p)
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

    profile = profile_of(args)
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
    p = subcommand(
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
