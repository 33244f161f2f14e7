"""A declared reading on test replayed from its committed per-seed test success: the training
(rlhf.studies.frontier.study.run_tasks) records what it was asked to train, and each seed's test
evaluation (rlhf.studies.frontier.confirmation.confirm_seed) writes the seed's test files from the
committed table, as the evaluation wrote them. Everything the study computes from there (the
declaration, the seed folders, the comparisons and their statistics, the success table) is the
code's own, so a study orchestrator can be run whole in the unit tier and compared with its
committed record."""

from __future__ import annotations

import json


def replay_reading(monkeypatch, table: dict[str, list[float]], points: dict[str, dict]) -> dict:
    """`table`: test success per seed of "sft" and of each declared point; `points`: name ->
    {"arm", "iteration"}. Returns what was asked: {"trained": [(folders, arm names)], "read": [...]}."""
    from rlhf.studies.frontier import confirmation, study
    from rlhf.studies.frontier.confirmation import test_file

    asked: dict = {"trained": [], "read": []}
    by_point = {(p["arm"], p["iteration"]): name for name, p in points.items()}

    def run_tasks(folders, arms, revision, settings, workers, say, confirm=False):
        asked["trained"].append(([f.name for f in folders], sorted(a.name for a in arms), revision, confirm))

    def confirm_seed(seed_dir, arms, revision, log=True):
        i = int(seed_dir.name.removeprefix("seed-"))
        for arm, iteration in arms:
            name = by_point[(arm.name, iteration)]
            path = test_file(seed_dir, arm, iteration)
            path.parent.mkdir(parents=True, exist_ok=True)
            metrics = {"sft": {"test": {"rubric_success": table["sft"][i]}},
                       "ppo": {"test": {"rubric_success": table[name][i]}}}  # fmt: skip
            path.write_text(json.dumps({"metrics": metrics}))
            asked["read"].append((seed_dir.name, name))
        return ""

    monkeypatch.setattr(study, "run_tasks", run_tasks)
    monkeypatch.setattr(confirmation, "confirm_seed", confirm_seed)
    return asked


def replay_nested_runs(monkeypatch, runs: dict, declared: dict, nudge: tuple | None = None) -> list:
    """A nested study's runs replayed from its committed run table (runs.json): run_points records
    the folders, points and PPO offsets it was asked for; each run's difference from its pipeline's
    SFT and its prompt variance are the committed ones (the run `nudge` = (label, j) one test prompt
    more). Returns what was asked."""
    from rlhf.studies import heldout, nested
    from rlhf.studies.verdict import declared_points

    _, nested_points = nested.nested_arms(declared_points(declared))
    where = {point: key for key, point in nested_points.items()}
    asked: list = []

    def run_points(folders, points, revision, workers, say, arms=()):
        asked.append(([f.name for f in folders], [p.key for p in points], [a.ppo_offset for a in arms], revision))

    def run_difference(folder, point):
        label, j = where[point]
        row = runs[label][int(folder.name.removeprefix("seed-"))][j]
        return row["difference"] + (1 / 180 if (label, j) == nudge else 0.0), row["prompt_variance"]

    monkeypatch.setattr(heldout, "run_points", run_points)
    monkeypatch.setattr(nested, "run_difference", run_difference)
    return asked
