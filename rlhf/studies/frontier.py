"""The over-optimisation frontier (SPEC §12): gold and proxy against sqrt(KL) for PPO arms and
best-of-n, chosen on validation prompts, confirmed once on test.

`rlhf frontier --out DIR [--revision r002] [--sft-budget sft-e7] [--n 3] [--workers W]`
`rlhf frontier --out DIR --confirm 5`     (after the study: the chosen point and the default on test)
`rlhf frontier --out DIR --summarise-to NEWDIR`   (the summary recomputed from stored measurements)

Per training seed i (study seed 1 of rlhf.studies.derivation; the confirmation uses study seed 2,
so its seeds are fresh), DIR/seed-i is a lab run folder (its own profile.toml) where:

  1. SFT and the judge train once (`rlhf lab`'s stages, without the interrupt/resume protocol);
  2. seed-i/frontier/sft.json measures the SFT policy on the validation prompts: greedy gold and
     proxy (iteration 0 of every arm), best-of-n (n = 1..16 temperature-1 samples, the judge's
     favourite kept), the spread sigma of the judge's scores of one temperature-1 SFT sample per
     validation prompt, and mean and SD of its scores of one sample per train (rollout) prompt;
  3. every arm runs PPO from that same SFT and judge, in seed-i/arms/ARM (its own run folder
     and profile.toml, `Context.trained_in` = seed-i), keeping the checkpoint PPO saves every
     `ppo.checkpoint_every` iterations; each checkpoint is measured on the validation prompts
     (seed-i/arms/ARM/validation/iter-NNNN.json: per-row answers kept).

Arms (ARMS): the SPEC's §6 as written (raw KL coefficient 0.02); §6 with the KL coefficient
beta = c * sigma for c in GRID (c: beta in units of the judge's spread, what beta would be on a
judge of SD 1); declared reward designs at the SPEC's 0.02 (`ppo.reward_design`,
rlhf.ppo_math.design_score): the judge standardised once on train-prompt SFT samples, an answer
without EOS paid the penalty instead of the score, the oracle control (the rubric's success on
the train prompt; a control, never selected); and the iterated judge and the worst-case judge
ensemble, at 0.02 and at the grid's best c (`Arm.c_from_grid`: chosen on validation once the
grid arms are measured, `grid_choice`). MORE_ARMS holds declared arms outside the default.

Nothing on this path reads a test prompt: SFT, judge and PPO read the learning view, and every
measurement takes the learning view only (rlhf.studies.validation). The best (arm, iteration)
by mean validation gold over seeds is written to frontier.json before `--confirm` may read test.

Crash-safe like `rlhf seeds`: each step writes its result whole and last, a rerun continues
where the study stopped, and a finished study (frontier.json there) recomputes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from rlhf import events, lab, rubric
from rlhf.checkpoint import load_state
from rlhf.config import ENSEMBLE_DESIGNS, load_profile
from rlhf.corpus import load_corpus
from rlhf.evaluate import bootstrap_differences, generate_heldout, rubric_rows, score_rows, summarise_populations
from rlhf.identities import code_sha256, describe_change
from rlhf.io import output_folder, read_json, write_json
from rlhf.roles import load_role
from rlhf.signals import RULES_FILE
from rlhf.studies import StudyError, worker_pool
from rlhf.studies.derivation import profile_source, seed_changes, write_run_profile
from rlhf.studies.seeds import identity_of_study
from rlhf.studies.sft_budget import budget_changes
from rlhf.studies.statistics import INTERVAL, across_seeds, across_table, gao_curve, gao_fit, metric_bounds
from rlhf.studies.validation import (
    KL_ESTIMATOR,
    best_of_n,
    best_of_n_ensemble,
    measure_policy,
    score_spread,
    validation_prompts,
)
from rlhf.studies.warnings import score_rules

FORMAT = "rlhf-frontier-1"
STUDY_SEED = 1
CONFIRM_STUDY_SEED = 2
SPEC_KL = 0.02
GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BON_NS = (1, 2, 4, 8, 16)
KL_SAMPLES = 2
POPULATIONS = ("test", "probe_rows", "probe_contexts", "all_rows", "all_unique_contexts")
POINT_STATS = (
    "gold",
    "proxy_std",
    "d",
    "kl",
    "gain",
    "truncations",
    "cut_at_limit",
    "undecodable",
    "repeats_polite_closing",
    "uncertified",
)
BON_KL = "KL(best-of-n || SFT) <= log n - (n - 1)/n: an upper bound (Beirami et al. 2024); d_bound is its square root"
GOLD = (
    "greedy rubric success on the validation prompts (best-of-n: the rubric success of the kept temperature-1 sample)"
)
PROXY = (
    "the judge's score of the same answers, standardised per judge: (s - mean) / SD of its scores "
    "of one temperature-1 SFT sample per validation prompt"
)
GRID_RULE = (
    "the c of the plain judge's arm (beta = c sigma) with the largest mean validation gold over seeds at any "
    "iteration >= 1; ties: the smaller c"
)
SELECTION_RULE = (
    "the largest mean validation gold over seeds among every (arm, iteration >= 1) but the oracle control; "
    "ties: smaller mean d, then the earlier arm and iteration"
)


@dataclass(frozen=True)
class Arm:
    """One PPO arm: its reward design and its KL coefficient, raw or in units of sigma."""

    name: str
    design: str  # ppo.reward_design
    c: float | None = None  # beta = c * sigma (sigma: this seed's judge spread on validation)
    raw: float | None = None  # beta as written
    actor_lr: float | None = None  # the actor's peak learning rate, when not the profile's
    ppo: tuple[tuple[str, object], ...] = ()  # other [ppo] keys of the design (refresh_every, ensemble_size, ...)
    c_from_grid: bool = False  # c is the grid's best (grid_choice), known once the grid's arms are measured

    def kl_coef(self, sigma: float) -> float:
        if self.raw is not None:
            return self.raw
        if self.c is None:
            raise ValueError(
                f"arm {self.name}: "
                + ("its c comes from the grid's best (grid_choice)" if self.c_from_grid else "no KL coefficient")
            )
        return self.c * sigma

    def changes(self, spread: dict) -> dict:
        """{(table, key): value} of this arm's profile, from the seed's measured spreads."""
        out: dict = {
            ("ppo", "kl_coef"): self.kl_coef(spread["validation"]["sd"]),
            ("ppo", "reward_design"): self.design,
        }
        if self.design == "standardised-judge":
            out[("ppo", "score_mean")] = spread["train"]["mean"]
            out[("ppo", "score_sd")] = spread["train"]["sd"]
        if self.actor_lr is not None:
            out[("ppo", "actor_lr")] = self.actor_lr
        out.update({("ppo", key): value for key, value in self.ppo})
        return out

    def describe(self) -> str:
        beta = f"beta = {self.c} sigma" if self.c is not None else f"beta = {self.raw} (raw)"
        if self.c_from_grid:
            beta = "beta = c sigma at the grid's best c" + ("" if self.c is None else f" ({self.c})")
        lr = "" if self.actor_lr is None else f", actor learning rate {self.actor_lr:g}"
        return f"{self.design}, {beta}{lr}" + "".join(f", {key} {value}" for key, value in self.ppo)


def default_arms(grid=GRID) -> tuple[Arm, ...]:
    return (
        Arm("spec-default", "judge", raw=SPEC_KL),
        *(Arm(f"c{c:g}", "judge", c=c) for c in grid),
        Arm("standardised-judge", "standardised-judge", raw=SPEC_KL),
        Arm("eos-less-replaced", "eos-less-replaced", raw=SPEC_KL),
        Arm("oracle", "oracle", raw=SPEC_KL),
        # The two designs that keep the judge in distribution, at the SPEC's coefficient and at the
        # grid's best (the best c of the plain judge, chosen on validation before these run).
        Arm("iterated-judge", "iterated-judge", raw=SPEC_KL),
        Arm("iterated-judge-cbest", "iterated-judge", c_from_grid=True),
        Arm("ensemble-min", "ensemble-min", raw=SPEC_KL),
        Arm("ensemble-min-cbest", "ensemble-min", c_from_grid=True),
    )


# Declared arms outside the default (Settings(arms=...)), left out to keep the study's time.
MORE_ARMS = (
    Arm("c0.005", "judge", c=0.005),
    # The oracle at a tenth of the embedded profile's actor learning rate (1e-4; the SPEC's is 5e-6).
    Arm("oracle-lr1e-5", "oracle", raw=SPEC_KL, actor_lr=1e-5),
    Arm("ensemble-mean", "ensemble-mean", raw=SPEC_KL),
    Arm("ensemble-uncertainty", "ensemble-uncertainty", raw=SPEC_KL),
)


ARMS = default_arms()

# The confirmation's third point: the SPEC's default stopped by one frozen warning rule
# (`rlhf lab --stop-on-warning kl_growth`), against the same default run to its fixed last
# iteration. The signal is the rule with the most early warnings on the study the rules were
# chosen on (rlhf.studies.warnings.best_rule on r002's validation runs: 13 of 39 falls warned
# early, 2 of 12 held runs warned falsely); a test recomputes that choice from the committed study.
STOP_SIGNAL = "kl_growth"
STOP_ARM = Arm(
    "spec-default-stop", "judge", raw=SPEC_KL, ppo=(("stop_on_warning", True), ("stop_signals", (STOP_SIGNAL,)))
)


@dataclass(frozen=True)
class Settings:
    """What the measurements use (part of the study's identity)."""

    arms: tuple[Arm, ...] = ARMS
    bon_ns: tuple[int, ...] = BON_NS
    kl_samples: int = KL_SAMPLES
    # Best-of-n ranked by each of these ensemble rewards too, on the same draws (with ensemble arms:
    # their members; none without).
    bon_ensembles: tuple[str, ...] = ENSEMBLE_DESIGNS

    def record(self) -> dict:
        return {
            "arms": [{**dataclasses.asdict(a), "ppo": [list(kv) for kv in a.ppo]} for a in self.arms],
            "bon_ns": list(self.bon_ns),
            "kl_samples_per_prompt": self.kl_samples,
            "bon_ensembles": list(self.bon_ensembles),
        }

    def ensemble_arm(self) -> Arm | None:
        """The first ensemble arm: its members and lambda rank the ensemble's best-of-n."""
        return next((a for a in self.arms if a.design in ENSEMBLE_DESIGNS), None)


def measurement_seeds(profile) -> dict[str, int]:
    """Generators of the measurements: from the profile's evaluation seed (kept across runs)."""
    e = profile.seeds.evaluation
    return {"best_of_n": e, "train_spread": e + 1, "kl": e + 2}


# ------------------------------------------------------------------------------ one seed


def _log_to(path: Path, stack: contextlib.ExitStack) -> None:
    f = stack.enter_context(open(path, "a", buffering=1))
    stack.enter_context(contextlib.redirect_stdout(f))
    stack.enter_context(contextlib.redirect_stderr(f))


def _roles_for_measuring(ctx: lab.Context):
    """The SFT actor and the frozen judge of the seed's folder (ctx.trained_in)."""
    return (
        _frozen_role(ctx, "actor", ctx.trained_in / "sft" / "actor.safetensors"),
        _frozen_role(ctx, "judge", ctx.trained_in / "judge" / "judge.safetensors"),
    )


def _frozen_role(ctx: lab.Context, kind: str, path: Path):
    role = ctx.role(kind)
    load_role(role, path)
    role.freeze()
    return role


def prepare_seed(
    seed_dir, revision: str, settings: Settings, *, confirm: bool = False, log: bool = True, ensemble: bool = False
) -> str:
    """SFT and judge (once; with `ensemble`, the ensemble's other members too), then
    seed-i/frontier/sft.json: the SFT policy on validation prompts (iteration 0, best-of-n, the
    judge's spreads). `confirm`: spreads only."""
    seed_dir = Path(seed_dir)
    if not _seed_ready(seed_dir, ensemble):  # else nothing to do (an extended study's seeds): not even opened
        _train_and_measure_sft(seed_dir, revision, settings, confirm=confirm, log=log, ensemble=ensemble)
    if ensemble and settings.bon_ensembles and not confirm and not (seed_dir / "frontier" / BON_ENSEMBLE).is_file():
        ensemble_best_of_n(seed_dir, revision, settings, log=log)
    return str(seed_dir)


def _train_and_measure_sft(seed_dir: Path, revision: str, settings: Settings, *, confirm, log, ensemble) -> None:
    with contextlib.ExitStack() as stack:
        if log:
            _log_to(seed_dir / "frontier.log", stack)
        ctx = lab.open_context(seed_dir, load_profile(str(seed_dir / "profile.toml")), revision=revision)
        for name, fn in (("sft", lab.stage_sft), ("judge", lab.stage_judge)):
            if not lab.stage_complete(ctx, name):
                fn(ctx, protocol=False)
        for name in lab.member_stages(ctx.profile, ensemble=ensemble):  # the ensemble arms' other judges
            if not lab.stage_complete(ctx, name):
                lab.stage_judge_member(ctx, name, protocol=False)
        out = seed_dir / "frontier" / "sft.json"
        if out.is_file():
            return
        sft, judge = _roles_for_measuring(ctx)
        view = ctx.corpus.learning_view()
        seeds = measurement_seeds(ctx.profile)
        t0 = time.perf_counter()
        if confirm:  # the spread only: one sample per prompt (the same draw as best-of-n's first)
            val = score_spread(
                sft.model,
                judge,
                validation_prompts(view, ctx.profile.evaluation.max_units),
                ctx,
                seed=seeds["best_of_n"],
            )
            record: dict = {"spread": {"validation": val}}
        else:
            bon = best_of_n(sft.model, judge, view, ctx, ns=settings.bon_ns, seed=seeds["best_of_n"])
            # The SFT policy itself: its KL from SFT is 0 by construction, so no sample is drawn for it.
            iteration0 = measure_policy(sft.model, sft.model, judge, view, ctx, kl_samples=0, seed=seeds["kl"])
            record = {
                "best_of_n": bon,
                "iteration_0": iteration0,
                "spread": {"validation": {**bon["spread"], "seed": seeds["best_of_n"]}},
            }
        record["spread"]["train"] = score_spread(
            sft.model, judge, view.rollout_prompts(), ctx, seed=seeds["train_spread"]
        )
        record["seeds"] = seeds
        record["seconds"] = time.perf_counter() - t0
        write_json(out, record)


BON_ENSEMBLE = "best-of-n-ensemble.json"  # in seed-i/frontier/
BON_ENSEMBLE_RUN = "best-of-n-ensemble"  # seed-i/best-of-n-ensemble: the run folder that measures it


def ensemble_best_of_n(seed_dir: Path, revision: str, settings: Settings, *, log: bool = True) -> None:
    """seed-i/frontier/best-of-n-ensemble.json: best-of-n ranked by each ensemble reward of
    `settings.bon_ensembles`, on the draws of the seed's best-of-n (the same seed), scored by the
    seed's judge and members as the first ensemble arm uses them (its k, its lambda). Measured in
    a run folder of its own (seed-i/best-of-n-ensemble) that reads the seed's trained states, so
    a study whose seeds were measured before can gain it; member 0's scores must equal those of
    the seed's best-of-n, or nothing is written."""
    arm = settings.ensemble_arm()
    if arm is None:
        raise StudyError("best-of-n under an ensemble needs an ensemble arm (its members)")
    spec = dataclasses.replace(arm, name=BON_ENSEMBLE_RUN, c=None, raw=SPEC_KL, c_from_grid=False)
    with contextlib.ExitStack() as stack:
        if log:
            _log_to(seed_dir / "frontier.log", stack)
        ctx = arm_context(seed_dir, spec, revision, run_dir=seed_dir / BON_ENSEMBLE_RUN)
        sft, _ = _roles_for_measuring(ctx)
        paths = lab.judge_files(ctx)  # the judge, then each member
        members = [_frozen_role(ctx, "judge", path) for path in paths]
        seed = measurement_seeds(ctx.profile)["best_of_n"]
        t0 = time.perf_counter()
        record = best_of_n_ensemble(
            sft.model,
            members,
            ctx.corpus.learning_view(),
            ctx,
            ns=settings.bon_ns,
            seed=seed,
            designs=settings.bon_ensembles,
        )
        stored = read_json(seed_dir / "frontier" / "sft.json")["best_of_n"]
        mine = [list(per_prompt) for per_prompt in zip(*record["member_scores"][0])]  # [P][n]
        if stored["seed"] != seed or mine != stored["scores"]:
            raise StudyError(
                f"{seed_dir}: the judge's scores of the ensemble's best-of-n draws differ from the seed's "
                "best-of-n: not the same samples. Nothing was written"
            )
        record["members"] = [p.parent.name for p in paths]
        record["seconds"] = time.perf_counter() - t0
        write_json(seed_dir / "frontier" / BON_ENSEMBLE, record)
        print(
            f"best-of-n under the ensemble ({len(members)} judges): "
            + "; ".join(
                f"{d} gold " + " ".join(f"{p['gold']:.3f}" for p in v["points"]) for d, v in record["designs"].items()
            ),
            flush=True,
        )


def _seed_ready(seed_dir: Path, ensemble: bool) -> bool:
    """The seed's SFT, judge (and, with `ensemble`, the members) complete and its SFT measured."""
    run = seed_dir / lab.RUN_FILE
    if not run.is_file() or not (seed_dir / "frontier" / "sft.json").is_file():
        return False
    stages = read_json(run)["stages"]
    profile = load_profile(str(seed_dir / "profile.toml"))
    return all(s in stages for s in ["sft", "judge", *lab.member_stages(profile, ensemble=ensemble)])


def measured_iterations(profile) -> list[int]:
    """The iterations whose actor is kept: every checkpoint PPO saves, and the last."""
    cfg = profile.ppo
    return [*range(cfg.checkpoint_every, cfg.iterations, cfg.checkpoint_every), cfg.iterations]


def arm_context(seed_dir: Path, arm: Arm, revision: str, *, run_dir: Path | None = None) -> lab.Context:
    """The arm's run folder seed-i/arms/ARM (or `run_dir`): its profile (written on first use,
    checked after), the seed's corpus and base, and the seed's SFT and judge to start from."""
    spread = read_json(seed_dir / "frontier" / "sft.json")["spread"]
    seed_profile = load_profile(str(seed_dir / "profile.toml"))
    arm_dir = run_dir or seed_dir / "arms" / arm.name
    profile = write_run_profile(
        arm_dir / "profile.toml",
        (seed_dir / "profile.toml").read_text(),
        f"{seed_profile.name}-{arm.name}",
        arm.changes(spread),
    )
    corpus = load_corpus(seed_dir / "corpus")
    if corpus.revision != revision:
        raise StudyError(f"{seed_dir} holds corpus {corpus.revision}, not {revision}")
    ctx = lab.Context(arm_dir, profile, seed_dir / "base_model", corpus, trained_in=seed_dir)
    lab.check_run_record(ctx)
    return ctx


def final_iteration(ctx: lab.Context) -> int:
    """How many iterations PPO's final state holds (as checkpoints count them): the profile's
    last, or fewer where a warning rule stopped it (stop_on_warning; a rule that fires at
    iteration k, counted from 0, stops PPO with k + 1 done)."""
    return len(read_json(ctx.run / "ppo" / "history.json")["iterations"])


def actor_at(ctx: lab.Context, iteration: int):
    """The arm's actor after `iteration` iterations, from its checkpoint or final state."""
    folder = ctx.run / "ppo"
    last = ctx.profile.ppo.iterations
    path = (
        folder / "state-continuous.pt.gz"
        if iteration == last
        else folder / "checkpoints" / f"continuous-{iteration:04d}.pt.gz"
    )
    state = load_state(path, lab.ppo_identity(ctx, lab.ppo_fingerprints(ctx)))
    actor = ctx.role("actor")
    load_role(actor, ctx.trained_in / "sft" / "actor.safetensors")
    actor.load_learned_state(state["actor"])
    actor.freeze()
    return actor


def run_arm(seed_dir, arm: Arm, revision: str, settings: Settings, *, measure: bool = True, log: bool = True) -> str:
    """PPO of one arm from the seed's SFT and judge, then every kept checkpoint on validation."""
    seed_dir = Path(seed_dir)
    arm_dir = seed_dir / "arms" / arm.name
    arm_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if log:
            _log_to(arm_dir / "lab.log", stack)
        ctx = arm_context(seed_dir, arm, revision)
        if not lab.stage_complete(ctx, "ppo"):
            lab.stage_ppo(ctx, protocol=False)
        if not measure:
            return str(arm_dir)
        sft, judge = _roles_for_measuring(ctx)
        view = ctx.corpus.learning_view()
        curves: events.ScalarLog | None = None
        seed = measurement_seeds(ctx.profile)["kl"]
        for it in measured_iterations(ctx.profile):
            out = arm_dir / "validation" / f"iter-{it:04d}.json"
            if out.is_file():
                continue
            t0 = time.perf_counter()
            m = measure_policy(
                actor_at(ctx, it).model, sft.model, judge, view, ctx, kl_samples=settings.kl_samples, seed=seed
            )
            if curves is None:
                curves = _validation_curves(seed_dir, arm_dir, it, first=it == measured_iterations(ctx.profile)[0])
                stack.enter_context(contextlib.closing(curves))
            curves.write(events.validation_scalars(m), it)
            curves.flush()
            write_json(out, {"iteration": it, **m, "seconds": time.perf_counter() - t0})
            print(
                f"{arm.name} iteration {it}: gold {m['gold']:.3f}  proxy {m['proxy']:+.2f}  KL {m['kl']:.3f}",
                flush=True,
            )
    return str(arm_dir)


def _validation_curves(seed_dir: Path, arm_dir: Path, it: int, first: bool) -> events.ScalarLog:
    """The arm's validation curves (tensorboard/validation), opened at the first checkpoint not yet
    measured (a rerun's purge step); a fresh series starts with the SFT policy's point at step 0."""
    curves = events.ScalarLog(arm_dir, "validation", 0 if first else it)
    sft = read_json(seed_dir / "frontier" / "sft.json").get("iteration_0")
    if first and sft is not None:
        curves.write(events.validation_scalars(sft), 0)
    return curves


def arm_complete(seed_dir: Path, arm: Arm, profile) -> bool:
    return all(
        (seed_dir / "arms" / arm.name / "validation" / f"iter-{it:04d}.json").is_file()
        for it in measured_iterations(profile)
    )


# ------------------------------------------------------------------------------ the study


def study_identity(
    profile_name: str, revision: str, n: int, sft_budget: str, settings: Settings, study_seed: int
) -> dict:
    ident = identity_of_study(FORMAT, "the frontier", profile_name, revision, n, study_seed, sft_budget)
    return {**ident, "settings": settings.record()}


def _check_record(path: Path, identity: dict) -> None:
    if not path.is_file():
        write_json(path, {"identity": identity})
        return
    change = describe_change(read_json(path)["identity"], identity)
    if change:
        raise StudyError(
            f"refusing to continue the study in {path.parent}: {change}. Nothing was written; use a new --out folder"
        )


# What an extension may change besides adding arms: the code (and so the profile's hash, when the code
# added a profile key with its default). The arms measured before keep their measurements; study.json
# keeps the identity (and code) of each version of the study (`extended_from`).
EXTENSION_MAY_CHANGE = ("settings", "code", "profile_sha256")


# Measurements a study may gain by extension: a setting the newer identity records and the older
# one lacks (the study was made before the measurement existed), with what the log calls it.
ADDABLE_MEASUREMENTS = {"bon_ensembles": "best-of-n under the ensembles"}


def added_arms(old: dict, new: dict) -> list[str] | None:
    """What `new` adds to the study of identity `old` - the names of its new arms, and of the
    measurements it gains (ADDABLE_MEASUREMENTS) - when that is its only change (every old arm
    kept as it was, in its order; the other settings, the study's format, profile, revision,
    seeds and budget the same; the code may be newer); else None."""
    same = {k: v for k, v in old.items() if k not in EXTENSION_MAY_CHANGE}
    if same != {k: v for k, v in new.items() if k not in EXTENSION_MAY_CHANGE}:
        return None
    so, sn = old["settings"], new["settings"]
    gained = [k for k in ADDABLE_MEASUREMENTS if k in sn and k not in so]
    if {k: v for k, v in so.items() if k != "arms"} != {k: v for k, v in sn.items() if k not in ("arms", *gained)}:
        return None
    names = {a["name"] for a in so["arms"]}
    if [a for a in sn["arms"] if a["name"] in names] != so["arms"]:
        return None
    return [a["name"] for a in sn["arms"] if a["name"] not in names] + [ADDABLE_MEASUREMENTS[k] for k in gained]


def extend_study(out: Path, identity: dict, say) -> bool:
    """Accept `identity` for the study in `out` when it only adds arms to the recorded one (a
    grid extended beyond its edge, say): study.json then records the new identity and the old
    ones it extends (`extended_from`), and a summary of the old arms (frontier.json, report.html)
    is moved aside to frontier-before-extension-N.json / .html. Returns True when it extended."""
    path = out / "study.json"
    if not path.is_file():
        return False
    record = read_json(path)
    added = added_arms(record["identity"], identity)
    if not added:
        return False
    k = len(record.get("extended_from", [])) + 1
    for name, ext in (("frontier", "json"), ("report", "html")):
        if (out / f"{name}.{ext}").is_file():
            (out / f"{name}.{ext}").rename(out / f"{name}-before-extension-{k}.{ext}")
    extended = {"identity": identity, "extended_from": [*record.get("extended_from", []), record["identity"]]}
    write_json(path, extended, overwrite=True)
    arms = [name for name in added if name not in ADDABLE_MEASUREMENTS.values()]
    parts = ([f"the arms {', '.join(arms)}"] if arms else []) + [name for name in added if name not in arms]
    say(f"study {out} extended by {' and '.join(parts)}; what was measured before is kept")
    return True


def move_aside_stale(folders: list[Path], arms: tuple[Arm, ...], say) -> None:
    """An arm at the grid's best c that ran at another c (the grid was extended and its best
    moved) is moved aside to arms/NAME@c<old c>, kept, and runs again at the new c."""
    for f in folders:
        sigma = read_json(f / "frontier" / "sft.json")["spread"]["validation"]["sd"]
        for arm in arms:
            folder = f / "arms" / arm.name
            if not (folder / "profile.toml").is_file():
                continue
            ran = load_profile(str(folder / "profile.toml")).ppo.kl_coef
            if ran != arm.kl_coef(sigma):
                old_c = ran / sigma
                folder.rename(f / "arms" / f"{arm.name}@c{old_c:.6g}")
                say(
                    f"{f.name}/{arm.name} ran at c = {old_c:.6g}, not the grid's best {arm.c:g}: moved aside, run again"
                )


def prepare_seed_folders(out: Path, profile_name: str, n: int, study_seed: int, sft_budget: str) -> list[Path]:
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


def run_tasks(
    folders: list[Path], arms: tuple[Arm, ...], revision: str, settings: Settings, workers: int, say, *, confirm=False
) -> None:
    """Every seed's preparation, then its arms, over `workers` processes (1: here, in order)."""
    profile = load_profile(str(folders[0] / "profile.toml"))
    measure = not confirm
    ensemble = any(a.design in ENSEMBLE_DESIGNS for a in arms)  # the seed trains the members these arms use
    todo_arms = {
        i: [
            a
            for a in arms
            if not (
                arm_complete(f, a, profile)
                if measure
                else (f / "arms" / a.name / "run.json").is_file() and _ppo_done(f, a)
            )
        ]
        for i, f in enumerate(folders)
    }
    t0 = time.perf_counter()
    if workers == 1:
        for i, f in enumerate(folders):
            prepare_seed(f, revision, settings, confirm=confirm, log=False, ensemble=ensemble)
            say(f"seed {i}: SFT, judge and the SFT measurements ready at {time.perf_counter() - t0:.0f} s")
            for a in todo_arms[i]:
                run_arm(f, a, revision, settings, measure=measure, log=False)
                say(f"seed {i}, arm {a.name}: done at {time.perf_counter() - t0:.0f} s")
        return
    failed = []
    with worker_pool(workers) as pool:
        pending: dict = {
            pool.submit(prepare_seed, str(f), revision, settings, confirm=confirm, ensemble=ensemble): ("seed", i, None)
            for i, f in enumerate(folders)
        }
        say(f"{len(folders)} seed(s) queued; logs in seed-i/frontier.log and seed-i/arms/ARM/lab.log")
        while pending:
            done, _ = wait(pending, timeout=30, return_when=FIRST_COMPLETED)
            for fut in done:
                kind, i, arm = pending.pop(fut)
                what = f"seed {i}" + (f", arm {arm.name}" if arm else ": SFT, judge and the SFT measurements")
                if fut.exception() is not None:
                    failed.append(what)
                    say(f"{what}: FAILED: {fut.exception()}")
                    continue
                say(f"{what}: done at {time.perf_counter() - t0:.0f} s")
                if kind == "seed":
                    for a in todo_arms[i]:
                        pending[pool.submit(run_arm, str(folders[i]), a, revision, settings, measure=measure)] = (
                            "arm",
                            i,
                            a,
                        )
    if failed:
        raise StudyError(f"{', '.join(failed)} failed; the rest is kept. Run the same command again to continue")


def _ppo_done(seed_dir: Path, arm: Arm) -> bool:
    path = seed_dir / "arms" / arm.name / "run.json"
    return path.is_file() and "ppo" in read_json(path).get("stages", {})


def run_frontier(
    out,
    *,
    n: int = 3,
    revision: str = "r002",
    sft_budget: str = "sft-e7",
    workers: int | None = None,
    profile_name: str = "embedded",
    settings: Settings = Settings(),
    say=print,
) -> dict:
    """The whole validation study (module docstring); returns frontier.json's content."""
    out = output_folder(out)
    identity = study_identity(profile_name, revision, n, sft_budget, settings, STUDY_SEED)
    done = out / "frontier.json"
    if any(a.c_from_grid for a in settings.arms) and not grid_arms(settings.arms):
        raise StudyError("arms that take c from the grid's best need grid arms (the plain judge at beta = c sigma)")
    extend_study(out, identity, say)
    if done.is_file():
        result = read_json(done)
        if result["study"] != identity:
            _check_record(out / "study.json", identity)  # names what differs
        say(f"frontier already complete in {out} (frontier.json): nothing recomputed")
        return result
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    _check_record(out / "study.json", identity)
    folders = prepare_seed_folders(out, profile_name, n, STUDY_SEED, sft_budget)
    workers = workers or os.cpu_count() or 1
    say(
        f"frontier {out}: {n} seed(s) of the embedded lab on {revision}, SFT budget {sft_budget}, "
        f"{len(settings.arms)} arms, {workers} worker(s)"
    )
    run_tasks(folders, tuple(a for a in settings.arms if not a.c_from_grid), revision, settings, workers, say)
    later = tuple(a for a in settings.arms if a.c_from_grid)
    if later:  # the arms at the grid's best c, once the grid is measured
        choice = cast(dict, grid_choice(folders, settings.arms))
        say(
            f"the grid's best: c = {choice['c']:g} ({choice['arm']}, mean validation gold "
            f"{choice['mean_validation_gold']:.3f} at iteration {choice['iteration']}); now "
            + ", ".join(a.name for a in later)
        )
        move_aside_stale(folders, resolved(later, choice), say)
        run_tasks(folders, resolved(later, choice), revision, settings, workers, say)
    result = {
        "study": identity,
        **collect(folders, settings),
        "command": frontier_command(out, identity),
        "wall_seconds_this_invocation": time.perf_counter() - t0,
    }
    from rlhf.report.frontier import write_frontier_report

    write_frontier_report(out, result)
    write_json(done, result)
    say(f"frontier complete: {done} and {out / 'report.html'}")
    return result


def grid_arms(arms) -> list[Arm]:
    """The coefficient grid: the plain judge's arms at beta = c sigma."""
    return [a for a in arms if a.design == "judge" and a.c is not None and not a.c_from_grid]


def grid_choice(folders: list[Path], arms) -> dict | None:
    """The grid's best c (GRID_RULE) from the grid arms' stored validation measurements; None
    without a grid."""
    grid = grid_arms(arms)
    if not grid:
        return None
    iterations = measured_iterations(load_profile(str(folders[0] / "profile.toml")))
    best: tuple | None = None
    for arm in grid:
        for it in iterations:
            golds = [read_json(f / "arms" / arm.name / "validation" / f"iter-{it:04d}.json")["gold"] for f in folders]
            gold = sum(golds) / len(golds)
            if best is None or (gold, -cast(float, arm.c)) > (best[0], -cast(float, best[1].c)):
                best = (gold, arm, it)
    gold, arm, it = cast(tuple, best)
    cs = [cast(float, a.c) for a in grid]
    return {
        "rule": GRID_RULE,
        "c": arm.c,
        "arm": arm.name,
        "iteration": it,
        "mean_validation_gold": gold,
        # At the grid's largest c, gold may still rise beyond it: the grid does not show where it stops.
        "at_edge": arm.c == max(cs),
    }


def resolved(arms, choice: dict | None) -> tuple[Arm, ...]:
    """`arms` with the grid's best c written into those that take it."""
    if any(a.c_from_grid for a in arms) and choice is None:
        raise StudyError("arms that take c from the grid's best need grid arms (the plain judge at beta = c sigma)")
    return tuple(dataclasses.replace(a, c=cast(dict, choice)["c"]) if a.c_from_grid else a for a in arms)


def settings_of(identity: dict) -> Settings:
    """The Settings a study's identity records."""
    rec = identity["settings"]
    return Settings(
        arms=tuple(Arm(**{**a, "ppo": tuple(tuple(kv) for kv in a.get("ppo", ()))}) for a in rec["arms"]),
        bon_ns=tuple(rec["bon_ns"]),
        kl_samples=rec["kl_samples_per_prompt"],
        bon_ensembles=tuple(rec.get("bon_ensembles", ())),  # a study made before they were measured: none
    )


def summarise_to(out, dest, say=print) -> dict:
    """The summary of a study's stored measurements (out/seed-i/frontier/, out/seed-i/arms/*/
    validation/) recomputed by this code into a new folder `dest`: frontier.json and report.html,
    and the confirmation's record and page when there is one. Nothing is trained or measured, so
    a later version of the summary (its fits, its counts) applies to measurements already made;
    `measured_by` names the code that measured, `summarised_by` the code that summarised."""
    out, dest = Path(out), Path(dest)
    if (dest / "frontier.json").exists():
        raise FileExistsError(f"{dest / 'frontier.json'} exists: summarise into a new folder")
    identity = read_json(out / "study.json")["identity"]
    settings = settings_of(identity)
    folders = [out / f"seed-{i}" for i in range(identity["n"])]
    profile = load_profile(str(folders[0] / "profile.toml"))
    missing = [f"{f.name}/{a.name}" for f in folders for a in settings.arms if not arm_complete(f, a, profile)] + [
        f.name for f in folders if not (f / "frontier" / "sft.json").is_file()
    ]
    if missing:
        raise StudyError(f"the study in {out} is not finished ({', '.join(missing)}): run it to the end first")
    result = {
        "study": identity,
        **collect(folders, settings),
        "command": frontier_command(out, identity),
        "measured_by": {"code": identity["code"], "folder": str(out)},
        "summarised_by": {"code": code_sha256()},
    }
    from rlhf.report.frontier import write_confirmation_report, write_frontier_report

    dest.mkdir(parents=True, exist_ok=True)
    write_frontier_report(dest, result)
    write_json(dest / "frontier.json", result)
    if (out / "confirmation.json").is_file():
        record = read_json(out / "confirmation.json")
        write_confirmation_report(dest, record, result)
        write_json(dest / "confirmation.json", record)
    say(f"summary of {out}: {dest / 'frontier.json'} and {dest / 'report.html'}")
    return result


def frontier_command(out: Path, identity: dict) -> str:
    cmd = f"rlhf frontier --out {out} --n {identity['n']} --revision {identity['revision']}"
    cmd += f" --sft-budget {identity['sft_budget']}"
    settings = settings_of(identity)
    grid = tuple(cast(float, a.c) for a in grid_arms(settings.arms))
    if grid != GRID and settings == Settings(arms=default_arms(grid)):
        cmd += " --grid " + ",".join(f"{c:g}" for c in grid)
    return cmd + ("" if identity["profile"] == "embedded" else " --profile PROFILE.toml")


# ------------------------------------------------------------------------------ collecting


def standardised(score: float, spread: dict) -> float:
    """A judge's score on the scale of its own SFT samples (mean 0, SD 1)."""
    return (score - spread["mean"]) / spread["sd"]


def _point(m: dict) -> dict:
    """One measurement's numbers, its answers' endings counted from its rows ("truncations":
    every answer without EOS, cut at the limit or holding an undecodable id)."""
    rows = m["rows"]
    return {
        "gold": m["gold"],
        "proxy": m["proxy"],
        "truncations": m["truncations"],
        "uncertified": m["uncertified"],
        "cut_at_limit": sum(r["finish_reason"] == "length" for r in rows),
        "undecodable": sum(r["finish_reason"] == "undecodable" for r in rows),
        "repeats_polite_closing": sum(r["response"].count(rubric.POLITE_CLOSING) >= 2 for r in rows),
    }


def collect(folders: list[Path], settings: Settings) -> dict:
    """Per seed, arm and iteration: gold, proxy (raw and standardised per judge), d, truncations;
    their mean and spread over seeds; best-of-n; Gao's fits; the grid's best c; the iterated
    judges' refreshes; the chosen operating point."""
    profile = load_profile(str(folders[0] / "profile.toml"))
    choice = grid_choice(folders, settings.arms)
    arm_list = resolved(settings.arms, choice)
    iterations = measured_iterations(profile)
    per_seed = []
    for i, f in enumerate(folders):
        sft = read_json(f / "frontier" / "sft.json")
        spread = sft["spread"]["validation"]
        it0 = sft["iteration_0"]
        seed = {
            "seed": i,
            "folder": f.name,
            "sigma_validation": spread["sd"],
            "mean_validation": spread["mean"],
            "train_spread": sft["spread"]["train"],
            "sft": {**_point(it0), "proxy_std": standardised(it0["proxy"], spread)},
            "best_of_n": [{**p, "proxy_std": standardised(p["proxy"], spread)} for p in sft["best_of_n"]["points"]],
            "arms": {},
        }
        for arm in arm_list:
            arm_profile = load_profile(str(f / "arms" / arm.name / "profile.toml"))
            points = [{**_point(it0), "iteration": 0, "kl": 0.0, "kl_se": 0.0, "d": 0.0}]
            for it in iterations:
                m = read_json(f / "arms" / arm.name / "validation" / f"iter-{it:04d}.json")
                points.append({**_point(m), **{k: m[k] for k in ("iteration", "kl", "kl_se", "d")}})
            for p in points:
                p["proxy_std"] = standardised(p["proxy"], spread)
                p["gain"] = p["gold"] - it0["gold"]
            seed["arms"][arm.name] = {
                "kl_coef": arm_profile.ppo.kl_coef,
                "reward_design": arm_profile.ppo.reward_design,
                "points": points,
            }
            if arm_profile.ppo.reward_design == "iterated-judge":
                history = read_json(f / "arms" / arm.name / "ppo" / "history.json")
                seed["arms"][arm.name]["refreshes"] = [{k: r[k] for k in REFRESH_KEYS} for r in history["refreshes"]]
        per_seed.append(seed)

    arms = {}
    fits: list[dict] = []  # each arm's Gao fit, in arm order
    ds: list[float] = []  # every arm point's mean d
    for arm in arm_list:
        rows = []
        for k, it in enumerate([0, *iterations]):
            pts = [s["arms"][arm.name]["points"][k] for s in per_seed]
            rows.append(
                {
                    "iteration": it,
                    **{key: across_seeds([p[key] for p in pts]) for key in POINT_STATS},
                }
            )
        fit_points = [
            (p["d"], p["gain"]) for s in per_seed for p in s["arms"][arm.name]["points"] if p["iteration"] > 0
        ]
        fits.append(gao_fit(fit_points, "rl"))
        ds += [float(cast(dict, row["d"])["mean"]) for row in rows]
        arms[arm.name] = {
            "design": arm.design,
            "c": arm.c,
            "raw": arm.raw,
            "c_from_grid": arm.c_from_grid,
            "describe": arm.describe(),
            "kl_coef_per_seed": [s["arms"][arm.name]["kl_coef"] for s in per_seed],
            "c_per_seed": [s["arms"][arm.name]["kl_coef"] / s["sigma_validation"] for s in per_seed],
            "curve": rows,
            "fit": fits[-1],
        }
        if arm.design == "iterated-judge":
            arms[arm.name]["refreshes"] = refreshes_across([s["arms"][arm.name]["refreshes"] for s in per_seed])
    bon = []
    for k, n in enumerate(settings.bon_ns):
        pts = [s["best_of_n"][k] for s in per_seed]
        bon.append(
            {
                "n": n,
                "kl_bound": pts[0]["kl_bound"],
                "d_bound": pts[0]["d_bound"],
                **{key: across_seeds([p[key] for p in pts]) for key in ("gold", "proxy_std", "truncations")},
            }
        )
    bon_points = [(p["d_bound"], p["gold"] - s["best_of_n"][0]["gold"]) for s in per_seed for p in s["best_of_n"]]
    bon_fit = gao_fit(bon_points, "bon")
    # Each fit that describes its points carries its curve up to the largest d of the study, so
    # that the report plots what the study computed (rlhf.report.frontier computes nothing).
    d_max = max(ds + [float(s["best_of_n"][k]["d_bound"]) for s in per_seed[:1] for k in range(len(bon))])
    for fit in [*fits, bon_fit]:
        fit["curve"] = gao_curve(fit, d_max)
    sft_level = across_seeds([s["sft"]["gold"] for s in per_seed])
    add_best_points(arms, sft_level["mean"])
    bon_ensemble = collect_ensemble_best_of_n(folders, settings, per_seed)
    return {
        "interval": INTERVAL,
        "kl_estimator": KL_ESTIMATOR,
        "bon_kl": BON_KL,
        "gold": GOLD,
        "proxy": PROXY,
        "iterations": [0, *iterations],
        "sft_level": sft_level,
        "seeds": per_seed,
        "arms": arms,
        "best_of_n": {
            "points": bon,
            "fit": bon_fit,
            "gain_over": "best-of-1 (one temperature-1 SFT sample)",
        },
        **({"best_of_n_ensemble": bon_ensemble} if bon_ensemble is not None else {}),
        "grid_choice": choice,
        "oracle_min_gain": ORACLE_MIN_GAIN,
        "selection": select(arms, sft_level),
        "warnings": score_rules(RULES_FILE, folders, per_seed, _identity_of(folders)),
    }


def collect_ensemble_best_of_n(folders: list[Path], settings: Settings, per_seed: list[dict]) -> dict | None:
    """Best-of-n ranked by each ensemble reward (seed-i/frontier/best-of-n-ensemble.json), per n:
    gold, the ranking reward and truncations over seeds; and per ranking (the judge alone, each
    ensemble) the change of gold from n = 1 to the largest n, per seed and over seeds. Each seed's
    points are added to its `per_seed` entry. None when the study measures none."""
    if settings.ensemble_arm() is None or not settings.bon_ensembles:
        return None
    records = [read_json(f / "frontier" / BON_ENSEMBLE) for f in folders]
    rate, count = (-1.0, 1.0), (0, len(records[0]["successes"]))  # a difference of rates; answers per seed
    designs = {}
    for design in settings.bon_ensembles:
        per = [r["designs"][design]["points"] for r in records]
        designs[design] = {
            "points": [
                {
                    "n": n,
                    "kl_bound": per[0][k]["kl_bound"],
                    "d_bound": per[0][k]["d_bound"],
                    "gold": across_seeds([p[k]["gold"] for p in per], (0.0, 1.0)),
                    "reward": across_seeds([p[k]["proxy"] for p in per]),
                    "truncations": across_seeds([p[k]["truncations"] for p in per], count),
                }
                for k, n in enumerate(settings.bon_ns)
            ],
            "gold_change": across_seeds([p[-1]["gold"] - p[0]["gold"] for p in per], rate),
        }
        for seed, points in zip(per_seed, per):
            seed.setdefault("best_of_n_ensemble", {})[design] = points
    return {
        "ensemble_size": records[0]["ensemble_size"],
        "ensemble_lambda": records[0]["ensemble_lambda"],
        "members": records[0]["members"],
        "ns": list(settings.bon_ns),
        "draws": "the same temperature-1 SFT samples as best-of-n under the judge (the same seed)",
        "judge_gold_change": across_seeds(
            [s["best_of_n"][-1]["gold"] - s["best_of_n"][0]["gold"] for s in per_seed], rate
        ),
        "designs": designs,
    }


def _identity_of(folders: list[Path]) -> dict | None:
    """The identity of the study the seed folders belong to (its study.json), if any."""
    path = folders[0].parent / "study.json"
    return read_json(path)["identity"] if path.is_file() else None


# The share of the oracle's gain an arm recovers is shown only where the oracle gains at least this
# much over SFT (the drop margin of the warnings, about 1.5 standard errors on 180 prompts): a share
# of a gain within the noise is no number.
ORACLE_MIN_GAIN = 0.05


def add_best_points(arms: dict, sft_gold: float) -> None:
    """Each arm's best checkpoint (largest mean validation gold over seeds, iteration >= 1; ties:
    the smaller mean d, then the earlier iteration), its gain over SFT, and the share of the
    oracle control's best gain it recovers (None without an oracle arm, or when the oracle's best
    gain is below ORACLE_MIN_GAIN)."""
    for arm in arms.values():
        best = max(arm["curve"][1:], key=lambda r: (r["gold"]["mean"], -r["d"]["mean"], -r["iteration"]))
        arm["best"] = {
            "iteration": best["iteration"],
            "gold": best["gold"]["mean"],
            "d": best["d"]["mean"],
            "gain": best["gold"]["mean"] - sft_gold,
        }
    oracle = arms.get("oracle", {}).get("best")
    for arm in arms.values():
        share = None
        if oracle is not None and oracle["gain"] >= ORACLE_MIN_GAIN:
            share = arm["best"]["gain"] / oracle["gain"]
        arm["best"]["share_of_oracle_gain"] = share


REFRESH_KEYS = ("after_iteration", "successes", "answers", "new_pairs", "accuracy_before", "accuracy_after")


def refreshes_across(per_seed: list[list[dict]]) -> list[dict]:
    """Each refresh point (after iteration n) over seeds: mean labelled pairs and rubric
    successes, and the judge's accuracy on the new pairs before and after (mean over the seeds
    that had pairs; `seeds_with_pairs` says how many)."""
    out = []
    for k, first in enumerate(per_seed[0]):
        at = [seed[k] for seed in per_seed]
        with_pairs = [r for r in at if r["accuracy_before"] is not None]
        out.append(
            {
                "after_iteration": first["after_iteration"],
                "answers": first["answers"],
                "successes": sum(r["successes"] for r in at) / len(at),
                "new_pairs": sum(r["new_pairs"] for r in at) / len(at),
                "seeds_with_pairs": len(with_pairs),
                **{
                    key: (sum(r[key] for r in with_pairs) / len(with_pairs) if with_pairs else None)
                    for key in ("accuracy_before", "accuracy_after")
                },
            }
        )
    return out


def select(arms: dict, sft_level: dict) -> dict:
    """The best (arm, iteration) by mean validation gold over seeds (iteration >= 1; the oracle
    control excluded; on a tie the smaller mean d, then the earlier arm and iteration)."""
    candidates = [
        (row["gold"]["mean"], -row["d"]["mean"], name, row["iteration"])
        for name, arm in arms.items()
        if arm["design"] != "oracle"  # a control that reads the rubric's target: shown, never chosen
        for row in arm["curve"]
        if row["iteration"] > 0
    ]
    order = {name: k for k, name in enumerate(arms)}
    best = max(candidates, key=lambda c: (c[0], c[1], -order[c[2]], -c[3]))
    return {
        "rule": SELECTION_RULE,
        "arm": best[2],
        "iteration": best[3],
        "mean_validation_gold": best[0],
        "sft_mean_validation_gold": sft_level["mean"],
        "above_sft": best[0] > sft_level["mean"],
        "default": {"arm": "spec-default", "iteration": arms["spec-default"]["curve"][-1]["iteration"]},
    }


# ------------------------------------------------------------------------------ confirmation on test


def test_rows(actor_model, reference_model, judge, ctx) -> list[dict]:
    """SPEC §8's greedy rows of one policy on the 180 test prompts and 80 probe rows, scored
    by the judge and checked by the rubric (rlhf.evaluate's building blocks)."""
    rows = generate_heldout(actor_model, ctx)
    return rubric_rows(score_rows(rows, ctx, actor_model, reference_model, judge), ctx)


def test_file(seed_dir: Path, arm: Arm, it: int | None) -> Path:
    """Where a confirmation seed keeps one point's test rows: at a fixed iteration, or (None)
    wherever the arm's PPO ended (a warning may have stopped it)."""
    name = "test-final.json" if it is None else f"test-iter-{it:04d}.json"
    return seed_dir / "arms" / arm.name / name


def confirm_seed(seed_dir, arms: tuple[tuple[Arm, int | None], ...], revision: str, log: bool = True) -> str:
    """Test evaluation of one confirmation seed: SFT once, each (arm, iteration) against it; an
    iteration of None is the arm's final state, wherever its PPO stopped."""
    seed_dir = Path(seed_dir)
    with contextlib.ExitStack() as stack:
        if log:
            _log_to(seed_dir / "frontier.log", stack)
        for arm, point in arms:
            out = test_file(seed_dir, arm, point)
            if out.is_file():
                continue
            ctx = arm_context(seed_dir, arm, revision)
            it = final_iteration(ctx) if point is None else point  # recorded: where a stopped run ended
            sft, judge = _roles_for_measuring(ctx)
            sft_path = seed_dir / "frontier" / "test-sft.json"
            if not sft_path.is_file():
                write_json(sft_path, {"rows": test_rows(sft.model, sft.model, judge, ctx)})
            sft_rows = read_json(sft_path)["rows"]
            # actor_at reads the final state (state-continuous) for the profile's last iteration,
            # which is where a stopped run saved its last state too
            ppo_rows = test_rows(
                actor_at(ctx, ctx.profile.ppo.iterations if point is None else point).model, sft.model, judge, ctx
            )
            write_json(
                out,
                {
                    "arm": arm.name,
                    "iteration": it,
                    "metrics": {"sft": summarise_populations(sft_rows), "ppo": summarise_populations(ppo_rows)},
                    "differences": bootstrap_differences(sft_rows, ppo_rows, ctx.profile.seeds.evaluation),
                    "ppo_rows": ppo_rows,
                },
            )
    return str(seed_dir)


def run_confirmation(out, *, n: int = 5, workers: int | None = None, say=print) -> dict:
    """The chosen operating point and the SPEC's default on `n` fresh seeds, on test (SPEC §8),
    with the seed study's across-seed statistics. Reads frontier.json's choice; writes
    confirmation.json and confirmation.html."""
    out = Path(out)
    frontier = out / "frontier.json"
    if not frontier.is_file():
        raise StudyError(
            f"no {frontier}: the operating point is chosen on validation first (rlhf frontier --out {out})"
        )
    result = read_json(frontier)
    done = out / "confirmation.json"
    if done.is_file():
        say(f"confirmation already complete in {out} (confirmation.json): nothing recomputed")
        return read_json(done)
    study = result["study"]
    settings = settings_of(study)
    by_name = {a.name: a for a in resolved(settings.arms, result.get("grid_choice"))}
    sel = result["selection"]
    points: list[tuple[Arm, int | None]] = [(by_name[sel["default"]["arm"]], sel["default"]["iteration"])]
    if (sel["arm"], sel["iteration"]) != (points[0][0].name, points[0][1]):
        points.append((by_name[sel["arm"]], sel["iteration"]))
    points.append((STOP_ARM, None))
    identity = {
        **study,
        "n": n,
        "study_seed": CONFIRM_STUDY_SEED,
        "code": code_sha256(),
        "points": [[a.name, it] for a, it in points],
    }
    root = out / "confirm"
    root.mkdir(parents=True, exist_ok=True)
    _check_record(root / "study.json", identity)
    profile_name = "embedded" if study["profile"] == "embedded" else str(out / "seed-0" / "profile.toml")
    folders = prepare_seed_folders(root, profile_name, n, CONFIRM_STUDY_SEED, study["sft_budget"])
    workers = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    say(
        f"confirmation {root}: {n} fresh seed(s); points: "
        + ", ".join(f"{a.name} at iteration {it}" if it is not None else f"{a.name} where it stops" for a, it in points)
    )
    run_tasks(folders, tuple(a for a, _ in points), study["revision"], settings, workers, say, confirm=True)
    for i, f in enumerate(folders):
        confirm_seed(f, tuple(points), study["revision"], log=workers > 1)
        say(f"seed {i}: test evaluated at {time.perf_counter() - t0:.0f} s")
    write_json(out / "confirmation-answers.json", confirmation_answers(folders, tuple(points)), overwrite=True)
    warned = confirmation_warnings(folders, points, study["revision"])
    say(f"warning rules scored on the confirmation seeds' test gold at {time.perf_counter() - t0:.0f} s")
    record = {
        "study": identity,
        "interval": INTERVAL,
        "points": [summarise_point(folders, a, it) for a, it in points],
        "warnings": warned,
        "wall_seconds_this_invocation": time.perf_counter() - t0,
    }
    from rlhf.report.frontier import write_confirmation_report

    write_confirmation_report(out, record, result)
    write_json(done, record)
    say(f"confirmation complete: {done} and {out / 'confirmation.html'}")
    return record


def test_gold_curve(seed_dir: Path, arm: Arm, revision: str) -> list[dict]:
    """A confirmation arm's test rubric success (gold) at every checkpoint its PPO kept, each
    stored in arms/ARM/test-gold/iter-NNNN.json: what its warnings are scored against on the
    confirmation seeds (the rules are frozen; nothing here chooses anything)."""
    ctx = arm_context(seed_dir, arm, revision)
    curve = []
    for it in measured_iterations(ctx.profile):
        path = seed_dir / "arms" / arm.name / "test-gold" / f"iter-{it:04d}.json"
        if not path.is_file():
            # Generated as the evaluation generates (probe rows in the same batches), so that the last
            # checkpoint's gold is the confirmation point's own to the bit; only test rows are kept.
            rows = [
                r for r in rubric_rows(generate_heldout(actor_at(ctx, it).model, ctx), ctx) if r["population"] == "test"
            ]
            success = [bool(r["rubric"]["rubric_success"]) for r in rows]
            write_json(
                path, {"iteration": it, "gold": sum(success) / len(success), "n": len(success), "success": success}
            )
        rec = read_json(path)
        curve.append({"iteration": rec["iteration"], "gold": rec["gold"]})
    return curve


CONFIRM_WARNINGS_GOLD = (
    "test rubric success of the greedy answers to the 180 test prompts at every kept checkpoint of "
    "the confirmation seeds' runs that went to the last iteration (not the stopped one), SFT's as the level"
)


def confirmation_warnings(folders: list[Path], points, revision: str) -> dict:
    """The frozen warning rules scored on the confirmation seeds: fresh training seeds that set
    no rule, with gold measured on test (CONFIRM_WARNINGS_GOLD)."""
    arms = [a for a, it in points if it is not None]
    per_seed = []
    for f in folders:
        sft = [r for r in read_json(f / "frontier" / "test-sft.json")["rows"] if r["population"] == "test"]
        seed = {"sft": {"gold": sum(r["rubric"]["rubric_success"] for r in sft) / len(sft)}, "arms": {}}
        for arm in arms:
            design = load_profile(str(f / "arms" / arm.name / "profile.toml")).ppo.reward_design
            seed["arms"][arm.name] = {"reward_design": design, "points": test_gold_curve(f, arm, revision)}
        per_seed.append(seed)
    return {**score_rules(RULES_FILE, folders, per_seed, None), "gold": CONFIRM_WARNINGS_GOLD}


ANSWER_KEYS = ("response", "finish_reason", "rubric_success", "learned_reward")


def confirmation_answers(folders: list[Path], points: tuple[tuple[Arm, int | None], ...]) -> dict:
    """Every held-out answer (test prompts and probe rows) of each confirmation seed, SFT's beside
    each point's: {seed folder:
    [{document_id, population, "sft": answer, "ARM@ITERATION": answer, ...}]}, an answer being its
    text, how it ended, its rubric success and the judge's score (a stopped point's key ends
    in "@stop"; its iteration per seed is in confirmation.json)."""

    def answer(row: dict) -> dict:
        return {k: row["rubric"]["rubric_success"] if k == "rubric_success" else row[k] for k in ANSWER_KEYS}

    out = {}
    for f in folders:
        sft = read_json(f / "frontier" / "test-sft.json")["rows"]
        rows = [{"document_id": r["document_id"], "population": r["population"], "sft": answer(r)} for r in sft]
        for arm, it in points:
            ppo = read_json(test_file(f, arm, it))["ppo_rows"]
            if [r["document_id"] for r in ppo] != [r["document_id"] for r in rows]:
                raise StudyError(f"{f.name}/{arm.name}: its test rows are not SFT's prompts in SFT's order")
            for row, r in zip(rows, ppo):
                row[f"{arm.name}@{'stop' if it is None else it}"] = answer(r)
        out[f.name] = rows
    return out


def summarise_point(folders: list[Path], arm: Arm, it: int | None) -> dict:
    """Per seed PPO - SFT on test per population, and across seeds (bounded intervals); `it`
    None: each seed's final state, at the iteration where its PPO stopped."""
    rows = []
    for i, f in enumerate(folders):
        rec = read_json(test_file(f, arm, it))
        spread = read_json(f / "frontier" / "sft.json")["spread"]["validation"]
        metrics = {}
        for pop in POPULATIONS:
            s, p = rec["metrics"]["sft"][pop], rec["metrics"]["ppo"][pop]
            metrics[f"rubric_success.{pop}.sft"] = s["rubric_success"]
            metrics[f"rubric_success.{pop}.ppo"] = p["rubric_success"]
            metrics[f"rubric_success.{pop}.ppo_minus_sft"] = p["rubric_success"] - s["rubric_success"]
            metrics[f"learned_reward_std.{pop}.ppo_minus_sft"] = (
                p["mean_learned_reward"] - s["mean_learned_reward"]
            ) / spread["sd"]
            metrics[f"without_eos.{pop}.ppo"] = p["without_eos"]
        kl_coef = load_profile(str(f / "arms" / arm.name / "profile.toml")).ppo.kl_coef
        rows.append(
            {
                "seed": i,
                "folder": f.name,
                "iteration": rec["iteration"],
                "kl_coef": kl_coef,
                "sigma_validation": spread["sd"],
                "metrics": metrics,
            }
        )
    return {
        "arm": arm.name,
        "describe": arm.describe(),
        "iteration": it,
        "seeds": rows,
        "across": across_table(rows, metric_bounds),
        "positive_test": across_seeds([r["metrics"]["rubric_success.test.ppo_minus_sft"] for r in rows], (-1.0, 1.0)),
    }
