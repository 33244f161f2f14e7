"""What a full run of `rlhf lab` costs on this machine, projected from a measured miniature.

The dry run (rlhf.miniature.dry_run) runs every stage of the lab at tiny budgets, once, with a
clock on every leg (rlhf.lab: a mark after each update or iteration and after each epoch's
validation) and each stage's fixed costs counted (rlhf.costs). Each stage is then

    stage  = stage fixed + sum over its legs of
             (leg fixed + units x per unit + validations x per validation)

    per unit        the median of a leg's update (SFT, judge) or iteration (PPO) intervals after
                    the first (the first carries the leg's warm-up: role copy, first kernels)
    per validation  the median of the intervals that end an epoch, per validation batch, times
                    the full validation's batches
    leg fixed       the leg's seconds less its units and validations: building and seeding its
                    roles, preparing its data, its final save
    stage fixed     the stage's seconds less its legs': the identity's role, the final files

and the lab with its interrupt/resume protocol runs three legs of each training stage: the
boundary leg to the protocol's boundary, the resumed leg from there, the continuous leg whole.
With the legs side by side (rlhf.legs: the continuous leg in a second process) the stage takes
the longer of the two processes instead of their sum:

    stage  = stage fixed + max(boundary leg + resumed leg, continuous leg)

Generation grows with the tokens drawn, so the miniature's cut answers are completed by the
decode step, measured as the difference of two generation lengths (`decode_step_seconds`), and
their teacher-forced passes by the scoring step, the difference of two answer lengths passed
(`scoring_step_seconds`: the evaluation's scoring of a batch of 32, and a PPO iteration's
passes over its rollout, backward passes included); the judge's scoring of fixed answers (probe
candidates, test pairs) runs at the judge's own rate, read from its validation
(`judge_row_seconds`):

    PPO iteration   = the miniature's iteration
                      + (64 - its rollout tokens) x (decode step + PPO's scoring step)
    evaluation      = load, bootstrap (fixed)
                      + politeness: the miniature's + the other probe answers x judge's rate
                      + per policy: batches x (the miniature's prefill and first steps
                        + (64 - its answer tokens) x decode step at the evaluation's batch size)
                      + per policy: scoring and rubric per row
                        + batches of 32 x (64 - its answer tokens) x scoring step
                      + the judge's test accuracy: the miniature's + the other answers x judge's rate
    shortcut audit  = its fixed part + its scoring + the other pairs' answers x judge's rate
    report, setup   = as measured (the corpus, the base, opening the run)

Every answer is counted at the 64-token limit: an answer that ends at EOS earlier costs less,
so generation is projected from above. Everything here reads files the miniature wrote.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from rlhf.config import Profile
from rlhf.io import read_json
from rlhf.tokens import max_new_tokens

TRAINING = ("sft", "judge", "ppo")
VALIDATION_BATCH = 16  # rlhf.sft.evaluate_loss / rlhf.judge.evaluate_pairs
EVALUATION_BATCH = 32  # rlhf.tokens.BATCH_SIZE
HELDOUT_ROWS = 260  # per policy: 180 test prompts + 80 probe rows (SPEC §8)
TEST_PAIRS = 180
VALIDATION_ITEMS = 180  # SFT validates on the 180 validation pairs' chosen answers, the judge on the pairs
EPOCH_BOUNDARY = 1  # the protocol stops SFT and the judge after epoch 1 (rlhf.lab)
PROBE_CANDIDATES = 4  # per probe context: correct or not x polite or not (rlhf.politeness)
PROBE_ANSWERS = 80  # 20 probe contexts x 4 candidates (SPEC §8)
REPEAT_BUDGET_S = 3.0  # a step measurement's calls per length stop repeating after this many seconds


# ------------------------------------------------------------------------- fitting a leg


def fit_leg(clock: list, seconds: float) -> dict:
    """From one leg's clock ([[seconds into the leg, units done], ...]): the median update or
    iteration after the first (`per_unit`), the median validation (`per_validation`, or None),
    their counts, and the rest of the leg (`fixed`)."""
    units: list[float] = []
    validations: list[float] = []
    last_t, last_units = 0.0, None
    for t, done in clock:
        (units if done != last_units else validations).append(t - last_t)
        last_t, last_units = t, done
    if len(units) < 2:
        raise ValueError(f"a leg needs at least 2 updates or iterations to fit, not {len(units)}")
    per_unit = statistics.median(units[1:])
    per_validation = statistics.median(validations) if validations else None
    fixed = seconds - len(units) * per_unit - len(validations) * (per_validation or 0.0)
    return {
        "per_unit": per_unit,
        "units": len(units),
        "per_validation": per_validation,
        "validations": len(validations),
        "fixed": fixed,
    }


def validation_batches(n_items: int) -> int:
    return math.ceil(n_items / VALIDATION_BATCH)


def stage_fit(run: Path, stage: str, mini: Profile) -> dict:
    """The fit of a measured training stage: its continuous leg (fit_leg) and its stage fixed part;
    a validation is per batch of the miniature's cut validation set."""
    timings = read_json(run / stage / "timings.json")
    leg = timings["legs"]["continuous"]
    fit = fit_leg(leg["clock"], leg["seconds"])
    if stage in ("sft", "judge"):
        cut = getattr(mini, stage).max_validation_examples
        fit["per_validation_batch"] = fit["per_validation"] / validation_batches(cut)
    fit["stage_fixed"] = timings["stage_seconds"] - leg["seconds"]
    fit["fixed_costs"] = timings.get("fixed_costs")
    return fit


# ------------------------------------------------------------------------- the decode and scoring steps


def step_seconds(call, device, lengths: tuple[int, int], repeats: int, budget_s: float) -> float:
    """Seconds one more token adds to `call(n, r)` (a call at length n, its r-th repeat): the
    difference of the two `lengths`, over their difference; one warm-up call of the short length
    (first calls, graph captures), then each length timed up to `repeats` times, the fastest kept
    (what the machine can do, whatever else ran meanwhile), and a length stops repeating once its
    calls have taken `budget_s` (a call that long is its own average: at full width on a CPU one
    call each, on a GPU all three). Everything the two lengths share cancels."""
    import torch

    def timed(n: int, times: int) -> float:
        seconds: list[float] = []
        for r in range(times):
            t = time.perf_counter()
            call(n, r)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t)
            if sum(seconds) >= budget_s:
                break
        return min(seconds)

    short, long = lengths
    timed(short, 1)
    return max(0.0, (timed(long, repeats) - timed(short, repeats)) / (long - short))


def decode_step_seconds(
    model,
    prompts: list[list[int]],
    *,
    pad_id: int,
    greedy: bool,
    last_logits_only: bool,
    lengths=(8, 24),
    repeats: int = 3,
    budget_s: float = REPEAT_BUDGET_S,
) -> float:
    """Seconds of one cached decode step of `model` for these prompts (`step_seconds`): two
    generation lengths without EOS, so every step runs; the prefill and every fixed cost cancel."""
    import torch

    from rlhf.generate import generate

    device = next(model.parameters()).device

    def call(n: int, r: int) -> None:
        gen = None if greedy else torch.Generator(device=device).manual_seed(r)
        generate(model, prompts, eos_id=-1, pad_id=pad_id, max_new_tokens=n, greedy=greedy, generator=gen,
                 last_logits_only=last_logits_only)  # fmt: skip

    return step_seconds(call, device, lengths, repeats, budget_s)


def scoring_step_seconds(
    score,
    prompts: list[list[int]],
    *,
    pad_id: int,
    token_id: int,
    device="cpu",
    lengths=(8, 40),
    repeats: int = 3,
    budget_s: float = REPEAT_BUDGET_S,
) -> float:
    """Seconds one more answer token adds to scoring a batch of `prompts` (`score(batch)`: the
    evaluation's teacher-forced passes, rlhf.evaluate.score_batch, or PPO's): two answer lengths
    (every answer `token_id` repeated), timed as `step_seconds`; the prompts' passes and every
    fixed cost cancel."""
    from rlhf.tokens import collate

    batches = {n: collate(prompts, [[token_id] * n for _ in prompts], pad_id).to(device) for n in lengths}
    return step_seconds(lambda n, _r: score(batches[n]), device, lengths, repeats, budget_s)


# ------------------------------------------------------------------------- the projection


def leg_plan(profile: Profile, stage: str, protocol: bool) -> list[dict]:
    """The legs `rlhf lab` runs of a training stage (SPEC §7): with the protocol, the boundary
    leg, the resumed leg and the continuous leg; each with its units and validations."""
    if stage == "ppo":
        total, boundary = profile.ppo.iterations, profile.ppo.resume_stop_iteration
        parts = [boundary, total - boundary, total] if protocol else [total]
        return [{"units": n, "validations": 0} for n in parts]
    from rlhf.sft import validates  # SFT's validation epochs (a long schedule validates on some)

    cfg = getattr(profile, stage)
    per_epoch = cfg.expected_updates // cfg.epochs
    spans = [(0, EPOCH_BOUNDARY), (EPOCH_BOUNDARY, cfg.epochs), (0, cfg.epochs)] if protocol else [(0, cfg.epochs)]
    counted = (lambda e: validates(e, cfg.epochs)) if stage == "sft" else (lambda e: True)
    return [{"units": (b - a) * per_epoch, "validations": sum(map(counted, range(a, b)))} for a, b in spans]


def project_training(
    fit: dict, profile: Profile, stage: str, protocol: bool, extra_per_unit: float = 0.0, side_by_side: bool = False
) -> dict:
    """Projected seconds of one training stage of `profile` from its fit; `side_by_side`: its
    continuous leg in a second process (the module docstring's max)."""
    per_unit = fit["per_unit"] + extra_per_unit
    per_validation = 0.0
    if stage in ("sft", "judge"):
        full = getattr(profile, stage).max_validation_examples or VALIDATION_ITEMS
        per_validation = fit["per_validation_batch"] * validation_batches(full)
    legs = leg_plan(profile, stage, protocol)
    each = [fit["fixed"] + leg["units"] * per_unit + leg["validations"] * per_validation for leg in legs]
    if side_by_side and protocol:  # boundary and resumed in this process, continuous in the other
        seconds = fit["stage_fixed"] + max(each[0] + each[1], each[2])
    else:
        seconds = fit["stage_fixed"] + sum(each)
    return {"per_unit_s": per_unit, "per_validation_s": per_validation, "legs": legs, "projected_s": seconds}


def judge_row_seconds(measured: dict) -> float:
    """Seconds of the frozen judge scoring one answer, from the judge's validation (rlhf.judge.
    evaluate_pairs: a batch of 16 pairs is 32 answers), measured over every epoch of its leg: the
    rate of the evaluation's and the audit's judge scoring, whose miniature calls are too short
    to time."""
    return measured["stages"]["judge"]["per_validation_batch"] / (2 * VALIDATION_BATCH)


def project_evaluation(
    measured: dict, decode_step: float, full_tokens: int, scoring_step: float, judge_row: float
) -> dict:
    """Projected seconds of the held-out evaluation from the miniature's (`measured`: its results'
    seconds, rows per policy, probe answers, test pairs and answer tokens): what the miniature
    measured, and what the full sets add at the rates measured apart (the decode step, the
    scoring step, the judge's seconds per answer)."""
    s, rows, pairs, tokens = measured["seconds"], measured["rows"], measured["pairs"], measured["tokens"]
    batches, full_batches = math.ceil(rows / EVALUATION_BATCH), math.ceil(HELDOUT_ROWS / EVALUATION_BATCH)
    out = {"fixed_s": s["load_roles"] + s["bootstrap"]}
    # the probe answers the judge scores (the rest of the exercise, hashing, is fixed)
    out["politeness_s"] = s["politeness"] + (PROBE_ANSWERS - measured["probe_answers"]) * judge_row
    for policy in ("sft", "ppo"):
        per_batch = s[f"{policy}_generation"] / batches + (full_tokens - tokens) * decode_step
        out[f"{policy}_generation_s"] = full_batches * per_batch
        # scoring grows with the rows and with each answer's tokens: a batch of 32 answers of
        # full_tokens costs (full_tokens - tokens) scoring steps more than the miniature's
        out[f"{policy}_scoring_s"] = (s[f"{policy}_scoring"] + s[f"{policy}_rubric"]) * HELDOUT_ROWS / rows + (
            HELDOUT_ROWS / EVALUATION_BATCH
        ) * (full_tokens - tokens) * scoring_step
    out["judge_test_accuracy_s"] = s["judge_test_accuracy"] + 2 * (TEST_PAIRS - pairs) * judge_row
    out["projected_s"] = sum(out.values())
    return out


def project_audit(measured: dict, judge_row: float) -> dict:
    """The shortcut audit: the miniature's, and the rest of the full audit's pairs (each set of
    the test pairs, in the miniature's proportions) at the judge's seconds per answer; loading
    and hashing are fixed."""
    full_pairs = measured["audit_pairs"] * TEST_PAIRS / measured["pairs"]
    scoring = measured["scoring_seconds"] + 2 * (full_pairs - measured["audit_pairs"]) * judge_row
    fixed = measured["seconds"] - measured["scoring_seconds"]
    return {"fixed_s": fixed, "scoring_s": scoring, "projected_s": fixed + scoring}


def project_lab(measured: dict, profile: Profile, *, protocol: bool = True, side_by_side: bool = False) -> dict:
    """Every stage of `rlhf lab` under `profile` (the full budgets), and the whole command, its
    legs one after the other or side by side (rlhf.legs)."""
    rollout = max_new_tokens(profile, "ppo")
    stages = {
        stage: project_training(
            measured["stages"][stage],
            profile,
            stage,
            protocol,
            extra_per_unit=(rollout - measured["ppo_rollout_tokens"])
            * (measured["decode_step"]["ppo"] + measured["scoring_step"]["ppo"])
            if stage == "ppo"
            else 0.0,
            side_by_side=side_by_side,
        )
        for stage in TRAINING
    }
    judge_row = judge_row_seconds(measured)
    stages["evaluate"] = project_evaluation(
        measured["evaluation"],
        measured["decode_step"]["evaluation"],
        max_new_tokens(profile, "evaluation"),
        measured["scoring_step"]["evaluation"],
        judge_row,
    )
    stages["shortcut_audit"] = project_audit(measured["shortcut_audit"], judge_row)
    stages["report"] = {"projected_s": measured["report_s"]}
    stages["setup"] = {"projected_s": measured["setup_s"]}
    return {
        "profile": profile.name,
        "protocol": protocol,
        "legs": "side-by-side" if side_by_side and protocol else "sequential",
        "stages": stages,
        "lab_s": sum(s["projected_s"] for s in stages.values()),
    }


def measured_miniature(run: Path, mini: Profile, decode_step: dict, scoring_step: dict, wall_s: float) -> dict:
    """What the projection reads from a miniature's run folder (every stage run once, without
    the protocol): each training stage's fit, the evaluation's and the audit's seconds and
    counts, the report's seconds, and the rest of the run's `wall_s` (setup); with the decode
    and scoring steps measured on its actor."""
    stages = {stage: stage_fit(run, stage, mini) for stage in TRAINING}
    record = read_json(run / "run.json")["stages"]
    evaluation = read_json(run / "evaluation" / "results.json")
    audit = read_json(run / "shortcut_audit" / "results.json")
    measured = {
        "stages": stages,
        "ppo_rollout_tokens": max_new_tokens(mini, "ppo"),
        "decode_step": decode_step,
        "scoring_step": scoring_step,
        "evaluation": {
            "seconds": evaluation["seconds"],
            "rows": len(evaluation["policies"]["sft"]["rows"]),
            "probe_answers": PROBE_CANDIDATES * evaluation["politeness"]["counts"]["contexts"],
            "pairs": evaluation["judge_test"]["pairs"],
            "tokens": max_new_tokens(mini, "evaluation"),
        },
        # the audit scores the evaluation's test pairs (their first units) under each prompt set
        "shortcut_audit": {
            "seconds": audit["seconds"],
            "scoring_seconds": audit["scoring_seconds"],
            "audit_pairs": sum(summary["pairs"] for summary in audit["counterfactuals"].values()),
            "pairs": evaluation["judge_test"]["pairs"],
        },
        "report_s": record["report"]["seconds"],
    }
    spent = sum(read_json(run / s / "timings.json")["stage_seconds"] for s in TRAINING)
    spent += sum(record[s]["seconds"] for s in ("evaluate", "shortcut_audit", "report"))
    measured["setup_s"] = max(0.0, wall_s - spent)
    return measured
