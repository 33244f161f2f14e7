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
decode step, measured as the difference of two generation lengths (`decode_step_seconds`):

    PPO iteration   = the miniature's iteration + (64 - its rollout tokens) x decode step
    evaluation      = load, politeness, bootstrap (fixed)
                      + per policy: batches x (the miniature's prefill and first steps
                        + (64 - its answer tokens) x decode step at the evaluation's batch size)
                      + scoring and rubric per batch of rows, the judge's test accuracy per pair
    shortcut audit  = its fixed part + its scoring per pair (5 sets of the test pairs)
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
AUDIT_SETS = 5  # the revision's own prompts and four counterfactual sets (rlhf.shortcut)


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


# ------------------------------------------------------------------------- the decode step


def decode_step_seconds(
    model,
    prompts: list[list[int]],
    *,
    pad_id: int,
    greedy: bool,
    last_logits_only: bool,
    lengths=(8, 24),
    repeats: int = 3,
) -> float:
    """Seconds of one cached decode step of `model` for these prompts: the difference of two
    generation lengths (no EOS, so every step runs), over their difference in tokens; each
    length timed `repeats` times, the fastest kept (what the machine can do, whatever else ran
    meanwhile). The prefill and every fixed cost cancel."""
    import torch

    from rlhf.generate import generate

    device = next(model.parameters()).device

    def timed(n: int) -> float:
        seconds = []
        for r in range(repeats):
            gen = None if greedy else torch.Generator(device=device).manual_seed(r)
            t = time.perf_counter()
            generate(
                model,
                prompts,
                eos_id=-1,
                pad_id=pad_id,
                max_new_tokens=n,
                greedy=greedy,
                generator=gen,
                last_logits_only=last_logits_only,
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t)
        return min(seconds)

    short, long = lengths
    timed(short)  # warm-up: first calls, graph captures
    return max(0.0, (timed(long) - timed(short)) / (long - short))


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


def project_evaluation(measured: dict, decode_step: float, full_tokens: int) -> dict:
    """Projected seconds of the held-out evaluation from the miniature's (`measured`: its results'
    seconds, rows per policy, test pairs and answer tokens)."""
    s, rows, pairs, tokens = measured["seconds"], measured["rows"], measured["pairs"], measured["tokens"]
    batches, full_batches = math.ceil(rows / EVALUATION_BATCH), math.ceil(HELDOUT_ROWS / EVALUATION_BATCH)
    out = {"fixed_s": s["load_roles"] + s["politeness"] + s["bootstrap"]}
    for policy in ("sft", "ppo"):
        per_batch = s[f"{policy}_generation"] / batches + (full_tokens - tokens) * decode_step
        out[f"{policy}_generation_s"] = full_batches * per_batch
        out[f"{policy}_scoring_s"] = (s[f"{policy}_scoring"] + s[f"{policy}_rubric"]) * full_batches / batches
    out["judge_test_accuracy_s"] = s["judge_test_accuracy"] * TEST_PAIRS / pairs
    out["projected_s"] = sum(out.values())
    return out


def project_audit(measured: dict) -> dict:
    """The shortcut audit: its scoring grows with the test pairs, the rest (the judge, the hashes) is fixed."""
    scoring = measured["scoring_seconds"] * TEST_PAIRS / measured["pairs"]
    return {"fixed_s": measured["seconds"] - measured["scoring_seconds"], "scoring_s": scoring,
            "projected_s": measured["seconds"] - measured["scoring_seconds"] + scoring}  # fmt: skip


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
            extra_per_unit=(rollout - measured["ppo_rollout_tokens"]) * measured["decode_step"]["ppo"]
            if stage == "ppo"
            else 0.0,
            side_by_side=side_by_side,
        )
        for stage in TRAINING
    }
    stages["evaluate"] = project_evaluation(
        measured["evaluation"], measured["decode_step"]["evaluation"], max_new_tokens(profile, "evaluation")
    )
    stages["shortcut_audit"] = project_audit(measured["shortcut_audit"])
    stages["report"] = {"projected_s": measured["report_s"]}
    stages["setup"] = {"projected_s": measured["setup_s"]}
    return {
        "profile": profile.name,
        "protocol": protocol,
        "legs": "side-by-side" if side_by_side and protocol else "sequential",
        "stages": stages,
        "lab_s": sum(s["projected_s"] for s in stages.values()),
    }


def measured_miniature(run: Path, mini: Profile, decode_step: dict, wall_s: float) -> dict:
    """What the projection reads from a miniature's run folder (every stage run once, without
    the protocol): each training stage's fit, the evaluation's and the audit's seconds and
    counts, the report's seconds, and the rest of the run's `wall_s` (setup)."""
    stages = {stage: stage_fit(run, stage, mini) for stage in TRAINING}
    record = read_json(run / "run.json")["stages"]
    evaluation = read_json(run / "evaluation" / "results.json")
    audit = read_json(run / "shortcut_audit" / "results.json")
    measured = {
        "stages": stages,
        "ppo_rollout_tokens": max_new_tokens(mini, "ppo"),
        "decode_step": decode_step,
        "evaluation": {
            "seconds": evaluation["seconds"],
            "rows": len(evaluation["policies"]["sft"]["rows"]),
            "pairs": evaluation["judge_test"]["pairs"],
            "tokens": max_new_tokens(mini, "evaluation"),
        },
        # the audit scores the evaluation's test pairs (their first units) under each prompt set
        "shortcut_audit": {
            "seconds": audit["seconds"],
            "scoring_seconds": audit["scoring_seconds"],
            "pairs": evaluation["judge_test"]["pairs"],
        },
        "report_s": record["report"]["seconds"],
    }
    spent = sum(read_json(run / s / "timings.json")["stage_seconds"] for s in TRAINING)
    spent += sum(record[s]["seconds"] for s in ("evaluate", "shortcut_audit", "report"))
    measured["setup_s"] = max(0.0, wall_s - spent)
    return measured
