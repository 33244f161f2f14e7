"""Choosing r002's testbed on validation prompts only: an SFT that is stable across seeds and
leaves PPO room to help (docs/studies.md).

`rlhf choose-testbed --out FILE.json --work DIR [--revision r002] [--workers W]`

The question "does a learned reward make PPO beat SFT?" needs two things of the SFT it starts
from: room (a reward that reads the rubric, the oracle control, raises held-out success) and
stability (one SFT seed more or less must not decide the answer). Cutting SFT's epochs leaves room
but lands on the steep part of its learning curve, where a seed either has learned the task or
has not. The rule, declared before measuring:

  1. SFT alone: every candidate of the round (ROUNDS: epoch cuts; a lower peak rate over the
     whole schedule; fewer demonstrations trained for the same number of updates or a share of
     them; any of these with a lower PPO actor rate: rlhf.studies.derivation) trained with SEEDS
     training seeds (runs 0 to SEEDS - 1 of the frontier's study seed); each seed's greedy
     validation rubric success; their mean, sample SD and smallest value.
  2. Stable, with room: the mean lies in the round's band, the SD is at most MAX_SD and no seed lies
     below MIN_SHARE of the mean.
  3. The oracle control for every candidate of step 2: the frontier's oracle arm (PPO at the
     SPEC's raw beta 0.02 paid the rubric's success on its own train prompt) on the first
     ORACLE_SEEDS of those seeds,
     a frontier study of that arm alone in WORK/oracle-CANDIDATE; its gain is the mean curve's
     best checkpoint after iteration 0 less the seeds' mean SFT gold.
  4. The testbed: among the candidates of step 2 whose oracle gain is at least GAIN, the one
     with the largest gain (the earlier in the round's order on a tie); none qualifying is the finding.

A round is declared before its measurements and never changed after them; a later round says
what it was declared after (`Round.declared`), and its record names its round and rule.

Step 1 runs one task per (candidate, seed) over the workers, each writing its row to
WORK/sft/CANDIDATE/seed-i.json as it finishes: a stopped study continues when its command is
rerun, and a finished one recomputes nothing. No test prompt can inform it: the trainers and
measurers get the corpus's learning view only, and step 3 is the frontier's validation study.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rlhf.config import load_profile, override, profile_hash
from rlhf.identities import code_sha256
from rlhf.io import output_folder, read_json, write_json
from rlhf.runtime import configure_torch
from rlhf.studies import StudyError, outcome, stopped_error, worker_pool
from rlhf.studies.derivation import DERIVATION, budget_changes, seed_changes
from rlhf.studies.record import ran_with, workers_count
from rlhf.studies.statistics import across_seeds

SEEDS = 10  # SFT seeds per candidate: runs 0..SEEDS-1 of the frontier's study seed
ORACLE_SEEDS = 5  # the oracle control's seeds: the first ORACLE_SEEDS of those
MAX_SD = 0.10  # stability: the SD of SFT's validation success across seeds
MIN_SHARE = 0.5  # stability: no seed below this share of the mean
GAIN = 0.10  # room shown: the oracle control's validation gain over SFT
# SFT is cheap (10 to 60 s a seed) and a seed that never learns the task is the failure this rule
# guards against, so SFT's spread is read on twice the seeds the oracle's gain is.


@dataclass(frozen=True)
class Round:
    """One declared round of the rule: its candidates, in declared order, and its band [low, high]
    of SFT's mean validation success (room). Seeds, stability and the oracle's gain are common."""

    number: int
    candidates: tuple[str, ...]
    low: float
    high: float
    declared: str  # when it was declared, and why


ROUNDS = {
    1: Round(
        1,
        (
            "sft-e6",
            "sft-e7",
            "sft-lr1.5e-3",
            "sft-lr1e-3",
            "sft-demos84",
            "sft-demos42",
            "sft-demos24",
            "sft-demos12",
            "sft-demos6",
        ),
        0.1,
        0.7,
        "first: today's epoch cut and the next, two lower rates over the profile's 20 epochs, and 84 to 6 "
        "demonstrations (every 2nd to every 28th family) trained for the profile's 420 updates",
    ),
    2: Round(
        2,
        ("sft-demos12", "sft-demos6", "sft-demos12-u210", "sft-demos6-u210", "sft-demos6-u105"),
        0.1,
        round(1 - GAIN, 2),
        "after round 1 (results/testbed-r002/), where no candidate qualified: the few-demonstration recipes "
        "were stable (SD 0.09 to 0.10) at means of 0.80 and 0.86, above round 1's band, whose upper edge 0.7 "
        "was a proxy for room; the oracle's gain of at least GAIN is the test of room itself, so the band's "
        "upper edge is now 1 - GAIN (SFT leaves at least that to gain); the two few-demonstration recipes "
        "again, and the same with half or a quarter of the updates",
    ),
    3: Round(
        3,
        ("sft-demos6-ppo-lr5e-5", "sft-demos6-ppo-lr2.5e-5", "sft-demos12-ppo-lr5e-5"),
        0.1,
        round(1 - GAIN, 2),
        "after round 2 (results/testbed-r002-2/), where no candidate qualified: sft-demos6 and sft-demos12 "
        "were stable (SD 0.09 and 0.10, lowest seeds 0.69 and 0.65) but the oracle gained +0.092 and +0.038; "
        "its per-seed curves rose by up to +0.21 within 20 to 50 iterations and fell back by iteration 60 "
        "(KL 2 to 6 nats), the mark of a step too large for 4 prompts an iteration, and the recipes with more "
        "room were unstable; the same two SFTs with PPO's actor rate at a half and a quarter of the "
        "profile's 1e-4 (the SPEC lets the embedded profile change learning rates, not PPO's batch or "
        "iterations)",
    ),
}
LATEST = max(ROUNDS)


def rule(r: Round) -> str:
    """The rule of round `r`, as its record states it."""
    return (
        f"round {r.number}: among the SFT candidates {', '.join(r.candidates)}, trained with {SEEDS} training "
        f"seeds each (runs 0 to {SEEDS - 1} of the frontier's study seed): those whose greedy validation rubric "
        f"success has a mean in [{r.low}, {r.high}], a sample SD of at most {MAX_SD} and no seed below "
        f"{MIN_SHARE} x the mean; of those, the one whose oracle control (PPO at the SPEC's raw beta 0.02 paid "
        f"the rubric's success on its train prompt, on the first {ORACLE_SEEDS} of those seeds) raises the mean "
        f"validation gold most at its best checkpoint after iteration 0, if by at least {GAIN}; ties go to the "
        f"earlier candidate; none qualifying is the finding"
    )


def stability(per_seed: list[float], r: Round = ROUNDS[LATEST]) -> dict:
    """Step 1's summary of one candidate and step 2's verdicts on it, in round `r`'s band."""
    stats = across_seeds(per_seed, (0.0, 1.0))
    mean, sd, low = stats["mean"], stats["sd"], min(per_seed)
    in_band = r.low <= mean <= r.high
    sd_ok = sd is not None and sd <= MAX_SD
    min_ok = low >= MIN_SHARE * mean
    return {
        "per_seed": per_seed,
        "mean": mean,
        "sd": sd,
        "min": low,
        "in_band": in_band,
        "sd_ok": sd_ok,
        "min_ok": min_ok,
        "stable_with_room": in_band and sd_ok and min_ok,
    }


def closest(candidates: list[dict]) -> str | None:
    """The stable candidate (with room in the band) whose oracle gains most on validation,
    however little; the earlier on a tie. Where none qualifies, the oracle is run on test there,
    so the finding "no testbed qualifies" is read beside the room the nearest one has on test."""
    best = None
    for c in candidates:
        oracle = c.get("oracle")
        if c["sft"]["stable_with_room"] and oracle:
            if best is None or oracle["gain"] > best["oracle"]["gain"]:
                best = c
    return None if best is None else best["name"]


def choose(candidates: list[dict]) -> str | None:
    """Step 4: the qualifying candidate with the largest oracle gain (the earlier on a tie): the
    closest one, when its gain reaches GAIN (then no other stable candidate's can be larger)."""
    best = closest(candidates)
    gain = next((c["oracle"]["gain"] for c in candidates if c["name"] == best), None)
    return best if gain is not None and gain >= GAIN else None


def recipe(testbed: dict, testbed_path: str) -> dict:
    """The SFT recipe a later study builds on, from a testbed record: the rule's choice, else the
    nearest candidate (closest), with the words that say which of the two it is."""
    chosen = testbed.get("chosen")
    name = chosen or closest(testbed["candidates"])
    if not name:
        raise StudyError(
            f"{testbed_path} chose no testbed and has no stable candidate with an oracle study: there is no "
            "testbed to build on (run rlhf choose-testbed with another --round)"
        )
    oracle = next(c for c in testbed["candidates"] if c["name"] == name)["oracle"]
    return {
        "sft_recipe": name,
        "testbed_qualifies": bool(chosen),
        "sft_recipe_rule": "the testbed rule's choice"
        if chosen
        else "none qualified: the stable candidate whose oracle gains most on validation "
        f"({oracle['gain']:+.3f}, below the rule's threshold)",
        "oracle": oracle,
    }


def seed_profile(profile, candidate: str, i: int):
    """The profile of run i at `candidate` (what the frontier writes into seed-i/profile.toml)."""
    from rlhf.studies.frontier.study import STUDY_SEED  # imported here: the CLI reads ROUNDS without torch

    changes: dict = {**budget_changes(profile, candidate), **seed_changes(profile, STUDY_SEED, i)}
    return override(profile, changes)


def sft_task(work: str, revision: str, profile_name: str, candidate: str, i: int) -> dict:
    """One (candidate, seed) of step 1, in a worker: SFT trained on the learning view, its greedy
    validation success, written to WORK/sft/CANDIDATE/seed-i.json (never overwritten)."""
    from rlhf.studies.sft_budget import measure_budget, prepare_work

    work_dir = Path(work)
    profile = load_profile(profile_name)
    configure_torch(profile)
    view, tokenizer, eos_id, pad_id = prepare_work(work_dir, revision, profile)
    row = {
        "candidate": candidate,
        "seed_index": i,
        "code": code_sha256(),
        **measure_budget(view, work_dir / "base_model", seed_profile(profile, candidate, i), tokenizer, eos_id, pad_id),
    }
    write_json(work_dir / "sft" / candidate / f"seed-{i}.json", row)
    return row


def measure_sft(
    work: Path, revision: str, profile_name: str, workers: int, say, candidates: tuple[str, ...]
) -> dict[str, list[dict]]:
    """Step 1 for every candidate and seed, only those without a row yet; rows by candidate."""
    todo = [(c, i) for c in candidates for i in range(SEEDS) if not (work / "sft" / c / f"seed-{i}.json").is_file()]
    if todo:
        say(f"step 1: {len(todo)} SFT runs of {len(candidates) * SEEDS} to train, {workers} worker(s)")
    if workers == 1:
        for c, i in todo:
            row = sft_task(str(work), revision, profile_name, c, i)
            say(f"  {c} seed {i}: validation {row['validation']['rubric_success']:.3f}")
    elif todo:
        with worker_pool(workers) as pool:
            pending = {pool.submit(sft_task, str(work), revision, profile_name, c, i): (c, i) for c, i in todo}
            while pending:
                for f in pool.wait(pending):
                    pending.pop(f)
                    if outcome(f) == "stopped":
                        continue
                    row = f.result()  # a failed SFT run raises here
                    success = row["validation"]["rubric_success"]
                    say(f"  {row['candidate']} seed {row['seed_index']}: validation {success:.3f}")
            if pool.stopping:
                raise stopped_error("each running SFT run")
    return {c: [read_json(work / "sft" / c / f"seed-{i}.json") for i in range(SEEDS)] for c in candidates}


def choose_testbed(
    out_json, work, revision: str = "r002", profile_name: str = "embedded", workers=None, say=print, round_number=LATEST
):
    """The rule (module docstring) of round `round_number`, steps 1 to 4; the record written to
    `out_json` (never overwritten) and returned. Every argument is checked before anything is written."""
    from rlhf.studies.frontier.study import STUDY_SEED
    from rlhf.studies.sft_budget import oracle_gain, prepare_work

    if round_number not in ROUNDS:
        raise StudyError(f"no testbed round {round_number!r}; the rounds are {', '.join(map(str, ROUNDS))}")
    r = ROUNDS[round_number]
    out_json = Path(out_json)
    if out_json.exists():
        raise FileExistsError(f"{out_json} exists: the testbed was already chosen (use a new --out)")
    profile = load_profile(profile_name)
    if profile.model.kind != "embedded":
        raise StudyError(f"the testbed is chosen on the embedded lab, not profile {profile.name}")
    workers = workers_count(workers)
    work = output_folder(work)
    configure_torch(profile)
    prepare_work(work, revision, profile)  # the corpus and the base once, before the workers read them
    t0 = time.perf_counter()
    rows = measure_sft(work, revision, profile_name, workers, say, r.candidates)
    candidates: list[dict] = []
    for name in r.candidates:
        sft = stability([row["validation"]["rubric_success"] for row in rows[name]], r)
        say(
            f"{name}: SFT validation success {sft['mean']:.3f} (SD {sft['sd']:.3f}, lowest {sft['min']:.3f}): "
            + ("stable, with room" if sft["stable_with_room"] else "not a testbed")
        )
        candidates.append(
            {
                "name": name,
                "changes": {f"{t}.{k}": v for (t, k), v in budget_changes(profile, name).items()},
                "sft": sft,
                "sft_train_seconds": [row["train_seconds"] for row in rows[name]],
            }
        )
    for c in candidates:
        if c["sft"]["stable_with_room"]:
            c["oracle"] = oracle_gain(
                work, c["name"], revision, profile_name, workers, say, n=ORACLE_SEEDS, prefix="oracle"
            )
            say(f"{c['name']}: the oracle control's gain over SFT {c['oracle']['gain']:+.3f} on validation")
    chosen = choose(candidates)
    record = {
        "revision": revision,
        "profile": profile.name,
        "profile_sha256": profile_hash(profile),
        **ran_with(),
        "seeds": {
            "frontier_study_seed": STUDY_SEED,
            "sft_runs": SEEDS,
            "oracle_runs": ORACLE_SEEDS,
            "derivation": DERIVATION,
        },
        "round": r.number,
        "declared": r.declared,
        "rule": rule(r),
        "band": [r.low, r.high],
        "max_sd": MAX_SD,
        "min_share_of_mean": MIN_SHARE,
        "gain_at_least": GAIN,
        "reads": "the learning view only (train demonstrations; validation prompts, actions read from their pairs' "
        "chosen answers) and the frontier's validation study; no test prompt",
        "candidates": candidates,
        "chosen": chosen,
        "command": f"rlhf choose-testbed --out {out_json} --work {work} --revision {revision} --round {r.number}",
        "seconds_this_invocation": time.perf_counter() - t0,
    }
    write_json(out_json, record)
    say(f"testbed: {chosen or 'none qualifies'} ({out_json})")
    return record
