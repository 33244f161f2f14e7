"""Declared comparisons read on test: fresh seeds, each trained once, every declared point
evaluated on test against the same seed's SFT (rlhf.studies.room and rlhf.studies.verdict use it).

A comparison is a per-seed difference of test rubric success: a point (an arm of the frontier
at a PPO iteration) less SFT, or one point less another, paired by seed. Before any test prompt
is read, the caller declares the points, the comparisons, and a seed count from the power rule
(rlhf.studies.statistics.seeds_needed) applied to each comparison's spread measured on
validation; the study record (DIR/study.json, written first and checked on every rerun) holds
that declaration and the commit that made it. Then:

  run_points    the seeds' SFT, judge and each point's arm trained (as the frontier's
                confirmation trains them: a stopped study continues when rerun), and each
                point's and SFT's greedy answers on test evaluated (SPEC §8)
  comparisons   per comparison: per-seed differences, mean, 95% Student-t interval (cut to
                [-1, 1]), the exact sign-flip p and the seeds up; no bootstrap interval (below
                10 seeds it undercovers, and the seeds are the unit here)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rlhf.io import read_json
from rlhf.studies import StudyError
from rlhf.studies.statistics import paired, seeds_needed, t975

HALF_WIDTH = 0.10  # the 95% half-width each declared comparison's seed count aims at
CAP = 40  # the most seeds the power rule may ask for


@dataclass(frozen=True)
class Point:
    """A policy read on test: `arm` (a frontier arm's name) at PPO iteration `iteration`."""

    arm: str
    iteration: int

    @property
    def key(self) -> str:
        return f"{self.arm}@{self.iteration}"


def power(spreads: dict[str, float]) -> dict:
    """The seed count for every declared comparison at once: the largest that the power rule asks
    for any of them (at most CAP), and each comparison's expected half-width at that count."""
    if not spreads:
        raise StudyError("a declaration needs at least one comparison")
    per = {name: seeds_needed(sd, HALF_WIDTH, CAP) for name, sd in spreads.items()}
    n = max(p["n"] for p in per.values())
    return {
        "rule": f"per comparison the smallest n >= 2 with t(0.975, n-1) * SD / sqrt(n) <= {HALF_WIDTH} (SD: its "
        f"per-seed spread on validation), at most {CAP}; the study runs the largest",
        "seeds": n,
        "per_comparison": {
            name: {"validation_sd": sd, "asks": per[name]["n"], "expected_half_width": t975(n - 1) * sd / n**0.5}
            for name, sd in spreads.items()
        },
        "capped": any(p["capped"] for p in per.values()),
    }


def run_points(
    folders: list[Path], points: tuple[Point, ...], revision: str, workers: int, say, arms: tuple = ()
) -> None:
    """Train each seed's SFT, judge and the points' arms (by name: `arms`, else the frontier's
    default arms), then evaluate every point and SFT on test."""
    from rlhf.studies.frontier.arms import Settings, default_arms
    from rlhf.studies.frontier.confirmation import confirm_seed
    from rlhf.studies.frontier.study import run_tasks

    by_name = {a.name: a for a in (arms or default_arms())}
    arms = tuple(by_name[name] for name in dict.fromkeys(p.arm for p in points))
    t0 = time.perf_counter()
    run_tasks(folders, arms, revision, Settings(arms=arms), workers, say, confirm=True)
    for i, f in enumerate(folders):
        confirm_seed(f, tuple((by_name[p.arm], p.iteration) for p in points), revision, log=workers > 1)
        say(f"seed {i}: test evaluated at {time.perf_counter() - t0:.0f} s")


def test_success(folder: Path, point: Point) -> tuple[float, float]:
    """(SFT's, the point's) test rubric success on one seed, from its confirmation file."""
    from rlhf.studies.frontier.confirmation import test_file

    m = read_json(test_file(folder, point.arm, point.iteration))["metrics"]
    return m["sft"]["test"]["rubric_success"], m["ppo"]["test"]["rubric_success"]


def comparisons(folders: list[Path], declared: dict[str, tuple[Point, Point | None]]) -> dict:
    """Every declared comparison {name: (a, b)} on the seeds' test files: a - b per seed, b None
    meaning the seed's SFT."""
    out = {}
    for name, (a, b) in declared.items():
        diffs = []
        for f in folders:
            sft, a_success = test_success(f, a)
            diffs.append(a_success - (sft if b is None else test_success(f, b)[1]))
        out[name] = {"a": a.key, "b": "sft" if b is None else b.key, **paired(diffs)}
    return out
