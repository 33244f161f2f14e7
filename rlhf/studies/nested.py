"""Variance split by source: PPO seeds nested in pipeline seeds (`rlhf nested --choice FILE --out DIR`).

Every other study moves the corpus order, SFT's, the judge's and PPO's seeds together, so "from
this SFT and this judge, does PPO help?" and "over the whole pipeline, does RLHF help?" are one
blurred question. Here PIPELINES pipeline seeds (runs of study seed NESTED_STUDY_SEED: data
order, SFT, judge) each run PPO with PPO_SEEDS PPO seeds ([seeds] ppo_offset = j * OFFSET_STRIDE,
j = 0 .. PPO_SEEDS - 1; j = 0 is the pipeline's own run), for the SPEC's default, the chosen design
and the oracle control at the points the verdict declares (rlhf.studies.verdict), each read on
test against its pipeline's SFT.

For each point, y_ij = test success of PPO seed j of pipeline i less pipeline i's SFT, and the
one-way random-effects split (n pipelines, k PPO seeds each):

    MS_pipeline = k * sum_i (mean_i - mean)^2 / (n - 1)
    MS_ppo      = sum_ij (y_ij - mean_i)^2 / (n (k - 1))
    var_ppo      = MS_ppo                                 PPO's own draws, one SFT and judge fixed
    var_pipeline = max(0, (MS_pipeline - MS_ppo) / k)     what the pipeline seed adds
    var_prompts  = mean_ij of the per-prompt paired differences' variance / 180
                                                          a new draw of 180 test prompts

and two intervals, each answering its own question:

    from one SFT and judge   per pipeline, mean_i +- t(0.975, k - 1) * sd_i / sqrt(k)
    over the whole pipeline  mean +- t(0.975, n - 1) * sqrt(MS_pipeline / (n k))
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from pathlib import Path

from rlhf.io import output_folder, read_json, write_json
from rlhf.studies import StudyError, heldout
from rlhf.studies.record import open_record, ran_with, workers_count
from rlhf.studies.statistics import t975

PIPELINES = 5
PPO_SEEDS = 3
NESTED_STUDY_SEED = 6  # fresh: 0 seeds, 1 frontier, 2 its confirmation, 3 room, 4 choice's estimate, 5 verdict
OFFSET_STRIDE = 7919  # a PPO seed's offset: j * this (a prime, so no two (pipeline, PPO seed) draws coincide)


def nested_arm_name(arm: str, j: int) -> str:
    return f"{arm}-ppo{j}"


def variance_split(y: list[list[float]], prompt_var: list[list[float]]) -> dict:
    """The module docstring's split and intervals of y[i][j] (pipeline i, PPO seed j) and of the
    per-run prompt variance of its mean difference prompt_var[i][j]."""
    n, k = len(y), len(y[0])
    if n < 2 or k < 2 or any(len(row) != k for row in y):
        raise StudyError(f"a nested split needs at least 2 pipelines of the same k >= 2 PPO seeds, not {y}")
    means = [sum(row) / k for row in y]
    grand = sum(means) / n
    ms_pipeline = k * sum((m - grand) ** 2 for m in means) / (n - 1)
    ms_ppo = sum((v - m) ** 2 for row, m in zip(y, means) for v in row) / (n * (k - 1))
    per_pipeline = []
    for row, m in zip(y, means):
        half = t975(k - 1) * statistics.stdev(row) / math.sqrt(k)
        per_pipeline.append({"mean": m, "t95": [m - half, m + half], "per_ppo_seed": row})
    half = t975(n - 1) * math.sqrt(ms_pipeline / (n * k))
    return {
        "n_pipelines": n,
        "k_ppo_seeds": k,
        "mean": grand,
        "ms_pipeline": ms_pipeline,
        "ms_ppo": ms_ppo,
        "var_ppo": ms_ppo,
        "var_pipeline": max(0.0, (ms_pipeline - ms_ppo) / k),
        "var_prompts": sum(v for row in prompt_var for v in row) / (n * k),
        "from_one_sft_and_judge": per_pipeline,
        "over_the_whole_pipeline": {"mean": grand, "t95": [grand - half, grand + half]},
    }


def run_difference(folder: Path, point: heldout.Point) -> tuple[float, float]:
    """One run's point - SFT test success and the prompt variance of that mean difference:
    var over the test prompts of (point's success - SFT's success) / prompts."""
    from rlhf.studies.frontier.confirmation import test_file

    def successes(rows):
        return {r["document_id"]: float(r["rubric"]["rubric_success"]) for r in rows if r["population"] == "test"}

    sft = successes(read_json(folder / "frontier" / "test-sft.json")["rows"])
    ppo = successes(read_json(test_file(folder, point.arm, point.iteration))["ppo_rows"])
    if sft.keys() != ppo.keys():
        raise StudyError(f"{folder}: {point.key}'s test prompts are not SFT's")
    diffs = [ppo[d] - sft[d] for d in sft]
    return sum(diffs) / len(diffs), statistics.variance(diffs) / len(diffs)


def run_table(folders: list[Path], points: dict, nested_points: dict) -> dict:
    """Per point label, per pipeline, per PPO seed: the run's difference from its pipeline's SFT
    and that difference's prompt variance (run_difference), from which the split is recomputed."""
    return {
        label: [
            [dict(zip(("difference", "prompt_variance"), run_difference(f, nested_points[(label, j)])))
             for j in range(PPO_SEEDS)]
            for f in folders
        ]
        for label in points
    }  # fmt: skip


def split_inputs(rows: list[list[dict]]) -> tuple[list[list[float]], list[list[float]]]:
    """variance_split's (y, prompt_var) from one label's run_table rows."""
    return [[r["difference"] for r in row] for row in rows], [[r["prompt_variance"] for r in row] for row in rows]


def declaration(choice_record: dict, choice_path: str) -> dict:
    """What the study runs, from the choice record alone: the answer on test's points
    (rlhf.studies.verdict.declaration), PIPELINES x PPO_SEEDS runs of each, the study seed."""
    from rlhf.studies import verdict

    points = verdict.declaration(choice_record, choice_path)
    return {
        "choice": choice_path,
        "points": points["points"],
        "pipelines": PIPELINES,
        "ppo_seeds": PPO_SEEDS,
        "offset_stride": OFFSET_STRIDE,
        "study_seed": NESTED_STUDY_SEED,
        "sft_recipe": points["sft_recipe"],
        "revision": points["revision"],
        "profile": points["profile"],
    }


def nested_arms(points: dict[str, heldout.Point]) -> tuple[tuple, dict]:
    """(the arms: each point's arm once per PPO seed j, its PPO draws offset by j * OFFSET_STRIDE;
    {(label, j): that run's point})."""
    from rlhf.studies.frontier.arms import default_arms

    by_name = {a.name: a for a in default_arms()}
    arms, nested_points = [], {}
    for label, p in points.items():
        for j in range(PPO_SEEDS):
            arm = dataclasses.replace(
                by_name[p.arm], name=nested_arm_name(p.arm, j), ppo_offset=j * OFFSET_STRIDE if j else None
            )
            arms.append(arm)
            nested_points[(label, j)] = heldout.Point(arm.name, p.iteration)
    return tuple(arms), nested_points


def run_nested(choice_json, out, workers=None, say=print) -> dict:
    """The nested study (module docstring); DIR/nested.json written last and returned."""
    from rlhf.studies.derivation import write_study_profiles
    from rlhf.studies.verdict import declared_points

    choice_path = str(choice_json)
    declared = declaration(read_json(Path(choice_json)), choice_path)
    points = declared_points(declared)
    workers = workers_count(workers)
    out = output_folder(out)
    open_record(out, declared)
    done = out / "nested.json"
    if done.is_file():
        say(f"the nested study is already complete in {done}: nothing recomputed")
        return read_json(done)
    arms, nested_points = nested_arms(points)
    folders = write_study_profiles(out, declared["profile"], PIPELINES, NESTED_STUDY_SEED, declared["sft_recipe"])
    t0 = time.perf_counter()
    say(f"nested: {PIPELINES} pipelines x {PPO_SEEDS} PPO seeds x {len(points)} points")
    heldout.run_points(folders, tuple(nested_points.values()), declared["revision"], workers, say, arms=arms)
    runs = run_table(folders, points, nested_points)
    split = {label: variance_split(*split_inputs(rows)) for label, rows in runs.items()}
    record = {
        "declared": declared,
        "runs": runs,
        "split": split,
        "seconds_this_invocation": time.perf_counter() - t0,
        "evaluated_by": ran_with(),
    }
    write_json(done, record)
    for label, s in split.items():
        say(
            f"{label} - SFT: mean {s['mean']:+.3f}; SD from PPO seeds {math.sqrt(s['var_ppo']):.3f}, from pipeline "
            f"seeds {math.sqrt(s['var_pipeline']):.3f}, from prompts {math.sqrt(s['var_prompts']):.3f}"
        )
    return record
