"""Choosing r002's SFT budget on validation prompts only: a budget where PPO has room to help
(docs/studies.md).

`rlhf choose-sft-budget --out FILE.json --work DIR [--revision r002] [--workers W]`

The frontier asks whether a learned reward makes PPO beat SFT. At a budget where even a reward
that reads the rubric (the oracle control) cannot raise held-out success, "no learned reward
beats SFT" says nothing about the learned reward. The rule, declared before measuring:

  1. SFT alone: for every named budget (SFT_BUDGETS: 1 to 10 epochs), the greedy validation
     rubric success of SFT trained with the frontier's training seeds (runs 0 to SEEDS - 1 of the
     frontier's study seed, rlhf.studies.derivation), averaged over them.
  2. The oracle control: for the budgets whose mean lies in [LOW, HIGH] (SFT neither never right
     nor leaving too little to gain), in increasing order, the frontier's oracle arm (PPO at the
     SPEC's raw beta 0.02 paid the rubric's success on its own train prompt; rlhf.studies.frontier)
     on those seeds, its greedy validation gold at every kept checkpoint: its gain is the mean
     curve's best checkpoint after iteration 0 less the seeds' mean SFT gold (frontier.json's
     `arms.oracle.best`). Each runs as a frontier study of the oracle arm alone in
     WORK/frontier-BUDGET, which `rlhf frontier` can extend with every other arm.
  3. The chosen budget: the first of step 2 whose gain is at least GAIN. Step 2 stops there; when
     none qualifies, every budget in the band is measured, none is chosen, and the record shows
     each one's gain.

`--budgets` limits step 1 to some budgets (a smaller one left out means no budget is chosen);
`--previous FILE` takes the step-1 measurements an earlier record of this rule made (same
revision, profile and seeds) instead of training them again. Every argument is checked before the
corpus or the base is made; the record keeps the commit and the code it ran with.

No test prompt can inform it: step 1 hands only the corpus's *learning view* (rlhf.corpus.
LearningView: train demonstrations, train/validation pairs, rollout prompts; it refuses test
inputs, probes and gold labels) to the code that trains and measures, and step 2 runs the
frontier's validation study, which reads validation prompts only (its confirmation on test is
another command). The action a validation prompt calls for is read from its pair's chosen answer.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from types import SimpleNamespace

from rlhf.config import Profile, load_profile, override, profile_hash
from rlhf.corpus import LearningView, load_corpus, prepare
from rlhf.embedded import build_embedded
from rlhf.identities import code_sha256
from rlhf.io import output_folder, read_json_of_kind, write_json
from rlhf.models import check_tokenizer, directory_identity, load_tokenizer
from rlhf.roles import new_role
from rlhf.runtime import configure_torch, seed_system_rngs
from rlhf.sft import train_sft
from rlhf.studies import StudyError
from rlhf.studies.derivation import DERIVATION, EPOCH_BUDGETS, RECIPES, SFT_BUDGETS, budget_changes, seed_changes
from rlhf.studies.frontier.arms import Settings, default_arms
from rlhf.studies.frontier.study import STUDY_SEED, run_frontier
from rlhf.studies.record import ran_with, workers_count
from rlhf.studies.validation import validation_rubric_success

LOW, HIGH = 0.1, 0.7  # the band of step 1: SFT's mean greedy validation success
GAIN = 0.10  # what the oracle control must add to SFT's validation gold (step 2)
SEEDS = 3  # the frontier's seeds: runs 0..SEEDS-1 of its study seed (STUDY_SEED)

RULE = (
    f"the smallest named budget (rlhf.studies.derivation.SFT_BUDGETS, 'full' excluded) whose SFT greedy "
    f"validation rubric success, averaged over the frontier's {SEEDS} training seeds, lies in [{LOW}, {HIGH}] "
    f"and where the oracle control (PPO at the SPEC's raw beta 0.02 paid the rubric's success on its train "
    f"prompt) raises the mean validation gold of those seeds by at least {GAIN} at its best checkpoint"
)


def candidate_budgets() -> list[str]:
    return sorted(EPOCH_BUDGETS, key=lambda k: EPOCH_BUDGETS[k])


def budget_record(name: str) -> dict:
    if name in RECIPES:
        return {"name": name, "recipe": RECIPES[name], "note": "an SFT recipe of the testbed rule (studies.testbed)"}
    return {
        "name": name,
        "epochs": SFT_BUDGETS[name],
        "candidates": candidate_budgets(),
        "rule": RULE,
        "note": "epochs None: the profile's own SFT budget",
    }


def measure_budget(view: LearningView, model_dir: Path, profile: Profile, tokenizer, eos_id: int, pad_id: int) -> dict:
    """Train SFT with `profile`'s budget on the learning view; its greedy validation success."""

    t0 = time.perf_counter()
    actor = new_role("actor", profile, model_dir, base_identity={"files": directory_identity(model_dir)})
    seed_system_rngs(profile.seeds.torch)  # as rlhf.lab.train_role
    state = train_sft(actor, view, tokenizer, eos_id, pad_id, profile)
    actor.model.eval()
    reader = SimpleNamespace(tokenizer=tokenizer, eos_id=eos_id, pad_id=pad_id, profile=profile)  # what answers read
    return {
        "updates": state["step"],
        "train_seconds": time.perf_counter() - t0,
        "last_validation_loss": state["history"]["epochs"][-1]["validation_loss"],
        "validation": validation_rubric_success(actor.model, view, reader),
    }


def seed_profiles(profile: Profile, budget: str) -> list[Profile]:
    """The profile of each of the frontier's seeds at `budget` (what rlhf.studies.derivation
    writes into the frontier's seed-i/profile.toml): its training seeds and SFT epochs."""
    budget_epochs: dict = budget_changes(profile, budget)
    seeds: list[dict] = [seed_changes(profile, STUDY_SEED, i) for i in range(SEEDS)]
    return [override(profile, {**budget_epochs, **run_seeds}) for run_seeds in seeds]


def measure_sft(view: LearningView, work: Path, profile: Profile, tokenizer, eos_id, pad_id, budget: str) -> dict:
    """Step 1 for `budget`: SFT trained with each frontier seed, its greedy validation success,
    and their mean (`sft_validation_success`)."""
    per_seed = [
        measure_budget(view, work / "base_model", p, tokenizer, eos_id, pad_id) for p in seed_profiles(profile, budget)
    ]
    return {
        "budget": budget,
        "epochs": SFT_BUDGETS[budget],
        "per_seed": per_seed,
        "sft_validation_success": statistics.fmean(m["validation"]["rubric_success"] for m in per_seed),
    }


def oracle_gain(
    work: Path, budget: str, revision: str, profile_name: str, workers: int, say, *, n: int = SEEDS, prefix="frontier"
) -> dict:
    """Step 2 for `budget`: the frontier study of the oracle arm alone on the frontier's seeds in
    WORK/frontier-BUDGET; its mean curve's best checkpoint after iteration 0 (frontier.json's
    `arms.oracle.best`: the gold, the iteration, the gain over the seeds' mean SFT gold)."""
    arms = tuple(a for a in default_arms() if a.name == "oracle")
    folder = work / f"{prefix}-{budget}"
    result = run_frontier(
        folder, n=n, revision=revision, sft_budget=budget, workers=workers, profile_name=profile_name,
        settings=Settings(arms=arms), say=say,
    )  # fmt: skip
    best = result["arms"]["oracle"]["best"]
    return {
        "study": str(folder),
        "sft_gold": result["sft_level"]["mean"],
        "sft_gold_per_seed": [s["sft"]["gold"] for s in result["seeds"]],
        "best_iteration": best["iteration"],
        "best_gold": best["gold"],
        "gain": best["gain"],
        "qualifies": best["gain"] >= GAIN,
    }


def in_band(m: dict) -> bool:
    return LOW <= m["sft_validation_success"] <= HIGH


def choose(measured: list[dict], order: list[str], oracle_of=None) -> str | None:
    """The rule, walked once in `order`: the first budget in the band whose oracle gain qualifies;
    None when none does, or at the first budget step 1 did not measure (nothing after it may be
    chosen). An in-band budget without an oracle record gets one from `oracle_of(m)` (step 2, run
    only where it can still decide the choice), stored in m["oracle"]."""
    by_name = {m["budget"]: m for m in measured}
    for name in order:
        if name not in by_name:
            return None
        m = by_name[name]
        if not in_band(m):
            continue
        if "oracle" not in m and oracle_of is not None:
            m["oracle"] = oracle_of(m)
        if m.get("oracle", {}).get("qualifies"):
            return name
    return None


def check_budgets(budgets: list[str] | None) -> list[str]:
    """--budgets: names among the candidates (candidate_budgets, 'full' excluded); None: all of them."""
    if budgets is None:
        return candidate_budgets()
    unknown = [b for b in budgets if b not in EPOCH_BUDGETS]
    if unknown or not budgets:
        raise StudyError(
            f"--budgets takes names among {', '.join(candidate_budgets())}, not {', '.join(map(repr, unknown))}"
        )
    return budgets


# What a record of this command holds (`--previous FILE` must be one).
RECORD_KEYS = {"revision": str, "profile_sha256": str, "rule": str, "command": str, "candidates": list}


def previous_candidates(paths, revision: str, profile: Profile) -> list[dict]:
    """Candidates measured by earlier records of the same revision and profile (each keeps the
    command and the code hash it was measured with); a file that is not such a record, or one of
    another revision or profile, is refused naming it."""
    out = []
    for path in paths or []:
        try:
            rec = read_json_of_kind(
                path, "choose-sft-budget record", RECORD_KEYS, "keys", "`rlhf choose-sft-budget --out FILE` writes one"
            )
        except ValueError as err:
            raise StudyError(f"--previous: {err}") from None
        if not all(isinstance(m, dict) and m.get("budget") in EPOCH_BUDGETS for m in rec["candidates"]):
            raise StudyError(f"--previous: {path} is not a choose-sft-budget record: a candidate is not a named budget")
        if (rec["revision"], rec["profile_sha256"]) != (revision, profile_hash(profile)):
            raise StudyError(f"--previous: {path} was measured on another revision or profile; measure again")
        if rec["rule"] != RULE:
            raise StudyError(f"--previous: {path} was measured under another rule ({rec['rule']}); measure again")
        out += [
            {
                **{k: v for k, v in m.items() if k != "oracle"},  # step 2 runs again: its study folder is this --work's
                "measured_by": m.get("measured_by", rec["command"]),
                "code": m.get("code", rec.get("code")),
            }
            for m in rec["candidates"]
        ]
    return out


def prepare_work(work: Path, revision: str, profile: Profile):
    """The corpus and the embedded base in `work` (each made once); the learning view, the
    tokenizer and its EOS and PAD ids."""
    if not (work / "corpus" / "manifest.json").is_file():
        prepare(work / "corpus", revision=revision)
    view = load_corpus(work / "corpus").learning_view()  # the only corpus object kept: no test input
    if view.revision != revision:
        raise StudyError(f"{work} holds corpus {view.revision}, not {revision}: use a new --work folder")
    if not (work / "base_model" / "config.json").is_file():
        build_embedded(work / "base_model")
    tokenizer = load_tokenizer(work / "base_model")
    eos_id, pad_id = check_tokenizer(profile, tokenizer)
    return view, tokenizer, eos_id, pad_id


def choose_sft_budget(
    out_json,
    work,
    revision: str = "r002",
    profile_name: str = "embedded",
    budgets: list[str] | None = None,
    previous=None,
    workers: int | None = None,
    say=print,
) -> dict:
    """The rule (module docstring): step 1 for every candidate budget (or `budgets`), step 2 in
    order over the band until one qualifies; the record written to `out_json` (never
    overwritten) and returned. Every argument is checked before anything is written."""
    out_json, work = Path(out_json), output_folder(work)
    if out_json.exists():
        raise FileExistsError(f"{out_json} exists: the budget was already chosen (use a new --out)")
    profile = load_profile(profile_name)
    if profile.model.kind != "embedded":
        raise StudyError(f"the SFT budget is chosen on the embedded lab, not profile {profile.name}")
    names = check_budgets(budgets)
    measured = previous_candidates(previous, revision, profile)
    workers = workers_count(workers)
    configure_torch(profile)
    view, tokenizer, eos_id, pad_id = prepare_work(work, revision, profile)
    t0 = time.perf_counter()
    command = (
        f"rlhf choose-sft-budget --out {out_json} --work {work} --revision {revision}"
        + (f" --budgets {','.join(budgets)}" if budgets else "")
        + "".join(f" --previous {p}" for p in previous or [])
    )
    for name in (n for n in names if all(m["budget"] != n for m in measured)):
        m = {
            **measure_sft(view, work, profile, tokenizer, eos_id, pad_id, name),
            "measured_by": command,
            "code": code_sha256(),
        }
        say(f"{name}: SFT greedy validation rubric success {m['sft_validation_success']:.3f} (mean of {SEEDS} seeds)")
        measured.append(m)
    measured.sort(key=lambda m: EPOCH_BUDGETS[m["budget"]])

    def oracle_of(m: dict) -> dict:
        oracle = oracle_gain(work, m["budget"], revision, profile_name, workers, say)
        say(f"{m['budget']}: the oracle control's gain over SFT {oracle['gain']:+.3f} on validation")
        return oracle

    chosen = choose(measured, candidate_budgets(), oracle_of)
    record = {
        "revision": revision,
        "profile": profile.name,
        "profile_sha256": profile_hash(profile),
        **ran_with(),
        "seeds": {"frontier_study_seed": STUDY_SEED, "runs": SEEDS, "derivation": DERIVATION},
        "rule": RULE,
        "band": [LOW, HIGH],
        "gain_at_least": GAIN,
        "inputs": "the learning view only (train demonstrations, validation pairs: prompts, actions read from the "
        "chosen answers) and the frontier's validation study; no test prompt",
        "candidates": measured,
        "chosen": chosen,
        "command": command,
        "not_measured": [b for b in candidate_budgets() if all(m["budget"] != b for m in measured)],
        "seconds": time.perf_counter() - t0,
    }
    write_json(out_json, record)
    return record
