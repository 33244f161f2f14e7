"""The studies' commands: the base study, the seed study and its reproduction, the frontier, and
the declared rules of the power study (SFT budget, testbed, the oracle's room, the design's choice,
its confirmation, the nested variance study)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from rlhf.cli.options import PROFILE_HELP, add_revision, subcommand
from rlhf.config import DEFAULT_PROFILE


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
    p = subcommand(
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

    p = subcommand(
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
    p = subcommand(
        sub,
        "reproduce",
        "recompute one seed of a committed study and compare its row byte for byte",
        "Recompute seed N of the committed study in RESULTS_DIR with today's code: `rlhf lab` on a seed\n"
        "study's (rlhf seeds) run profile; the SFT, judge and arms of an answer on test (rlhf\n"
        "confirm-design), of the room on test (rlhf confirm-oracle), of a nested study's pipeline\n"
        "(rlhf nested) or of a frontier study's seed (rlhf frontier, rlhf choose-design's selection\n"
        "and estimation). Its row is compared with the committed one in canonical JSON: exit 0 when\n"
        "they are the same bytes, 1 naming the first difference. Same CPU arithmetic expected (the\n"
        "CPU pin; `rlhf arithmetic` says whether this machine computes like the verified ones).",
        "rlhf reproduce results/seeds-r001 --seed 0 --work runs/reproduce-r001-0\n"
        "rlhf reproduce results/verdict-r002 --seed 0 --work runs/reproduce-verdict-0\n"
        "rlhf reproduce results/nested-r002 --seed 0 --work runs/reproduce-nested-0\n"
        "rlhf reproduce results/choice-r002/estimation --seed 0 --work runs/reproduce-estimation-0",
    )
    p.add_argument(
        "results",
        help="the committed study's folder (seeds.json, test_success.json, runs.json, room.json or frontier.json)",
    )
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

    p = subcommand(
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
    p = subcommand(
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

    p = subcommand(
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

    p = subcommand(
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

    p = subcommand(
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


def cmd_compare_methods(args) -> int:
    from rlhf.studies.compare_methods import compare_methods

    compare_methods(args.choice or args.frontier, args.out, workers=args.workers)
    print(f"written to {Path(args.out) / 'methods.json'}")
    return 0


def add_compare_methods(sub) -> None:
    """`rlhf compare-methods`: its options, beside the command it runs."""
    from rlhf.studies.compare_methods import DPO_BETAS, GRPO_GROUP, SEEDS

    p = subcommand(
        sub,
        "compare-methods",
        "DPO and GRPO beside PPO on a choice's or a frontier's testbed, on validation prompts only",
        textwrap.fill(
            f"Run DPO (from the judge's train pairs, beta {', '.join(f'{b:g}' for b in DPO_BETAS)}) and GRPO "
            f"(G = {GRPO_GROUP} answers per prompt, paid by the judge, no critic) as frontier arms beside PPO's "
            f"SPEC default, the chosen design and the oracle control (rlhf.studies.compare_methods), on {SEEDS} "
            f"seeds of the choice's selection study and its testbed (or of a frontier study, --frontier, and its "
            f"chosen arm), every point measured on the validation "
            f"prompts. DIR/methods.json: each method's best point, its gain over SFT and share of the oracle's "
            f"gain, and each arm's seconds per iteration or epoch. A stopped study continues when rerun.",
            width=100,
            break_on_hyphens=False,
        ),
        "rlhf compare-methods --choice results/choice-r002/choice.json --out runs/methods-r002 --workers 2",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--choice", help="the choice record (rlhf choose-design) naming the testbed")
    source.add_argument(
        "--frontier", help="or a frontier record (rlhf frontier's frontier.json): its SFT budget, its chosen arm"
    )
    p.add_argument("--out", required=True, help="study folder (study.json first, frontier/, methods.json last)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.set_defaults(func=cmd_compare_methods)


def cmd_confirm_methods(args) -> int:
    from rlhf.studies.compare_methods import confirm_methods

    confirm_methods(args.methods, args.out, workers=args.workers)
    print(f"written to {Path(args.out) / 'confirmation.json'}")
    return 0


def add_confirm_methods(sub) -> None:
    """`rlhf confirm-methods`: its options, beside the command it runs."""
    from rlhf.studies.compare_methods import CONFIRM_STUDY_SEED, VERDICT_STUDY

    p = subcommand(
        sub,
        "confirm-methods",
        "DPO's and GRPO's best points on test, under the answer on test's protocol",
        textwrap.fill(
            f"Read DPO's and GRPO's best validation points (DIR/methods.json of rlhf compare-methods) on test "
            f"(rlhf.studies.compare_methods): first OUT/study.json declares the points, each method - SFT and each "
            f"method - the SPEC's default (paired by seed) and the seed count of the committed answer on test "
            f"({VERDICT_STUDY}; on a frontier's testbed, of that frontier's confirmation); then that many "
            f"fresh seeds (study seed {CONFIRM_STUDY_SEED}) are trained and "
            f"read on test. OUT/confirmation.json: per comparison the per-seed differences, mean, Student-t "
            f"interval, exact sign-flip p and seeds up. A stopped study continues when rerun.",
            width=100,
            break_on_hyphens=False,
        ),
        "rlhf confirm-methods --methods runs/methods-r002/methods.json --out runs/methods-r002-test --workers 2",
    )
    p.add_argument("--methods", required=True, help="the methods record (rlhf compare-methods) naming the points")
    p.add_argument(
        "--out", required=True, help="study folder (study.json, the declaration, first; confirmation.json last)"
    )
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.set_defaults(func=cmd_confirm_methods)


def cmd_nested(args) -> int:
    from rlhf.studies.nested import run_nested

    run_nested(args.choice, args.out, workers=args.workers)
    print(f"written to {Path(args.out) / 'nested.json'}")
    return 0


def add_nested(sub) -> None:
    """`rlhf nested`: its options, beside the command it runs."""
    from rlhf.studies.nested import NESTED_STUDY_SEED, PIPELINES, PPO_SEEDS

    p = subcommand(
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
    p = subcommand(
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
