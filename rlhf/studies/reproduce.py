"""`rlhf reproduce RESULTS_DIR --seed N [--work DIR]`: one seed of a committed study, recomputed
with today's code and compared byte for byte with the committed row. The row, by what the folder
holds (KINDS):

  seeds.json         a seed study's row of run N (below)
  test_success.json  an answer on test (`rlhf confirm-design`): seed N's test success of SFT and
                     of each declared point (rlhf.studies.verdict.success_table)
  runs.json          a nested study (`rlhf nested`): pipeline N's runs, each one's difference from
                     SFT on test and its prompt variance (rlhf.studies.nested.run_table)
  room.json          the room on test (`rlhf confirm-oracle`): seed N's test success of SFT and of
                     the oracle control, and their difference
  frontier.json      a frontier study (`rlhf frontier`, and the choice's selection and estimation):
                     seed N's summary, every arm's validation points (frontier.json's seeds[N])

Each seed's SFT, judge and arms are trained from its run profile as the study trained them, and
measured as it measured them.

A seed study's row (rlhf.studies.seeds.seed_row: the run's seeds, every held-out number, the
shortcut audit, the politeness counts, the hashes of its trained states and data order) holds
no duration, so a run of the same code on a CPU of the same arithmetic gives the same bytes
(rlhf.runtime: the pinned arithmetic; `rlhf arithmetic` says whether this CPU computes like the
ones the golden numbers were verified on). The run is `rlhf lab` on the study's run profile of
seed N (written as the study writes it: rlhf.studies.derivation) with the protocol the study ran
with; its row is compared in canonical JSON and the first difference named. Every argument is
checked before anything is written; the work folder is a run folder like any (a rerun continues).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rlhf import runtime
from rlhf.config import load_profile, profile_hash
from rlhf.io import dumps_json, output_folder, read_json, read_json_of_kind, write_json
from rlhf.studies import StudyError
from rlhf.studies.derivation import profile_source, write_study_profiles
from rlhf.studies.record import ran_with
from rlhf.studies.seeds import FORMAT, run_seed, seed_row


def committed_row(results: Path, seed: int, profile_name: str | None = None) -> tuple[dict, dict]:
    """(the study's identity, its committed row of `seed`), each argument checked: a folder of a
    seed study, a seed it ran, and its profile (`profile_name`, default the one the study names)
    unchanged since."""
    results = Path(results)
    if not (results / "study.json").is_file() or not (results / "seeds.json").is_file():
        raise StudyError(f"RESULTS_DIR {results} holds no seed study (study.json and seeds.json of `rlhf seeds`)")
    made_by = "`rlhf seeds --out DIR` writes it"
    try:
        identity = read_json_of_kind(results / "study.json", "seed study record", {"identity": dict}, "key", made_by)[
            "identity"
        ]
        rows = read_json_of_kind(results / "seeds.json", "seed study summary", {"seeds": list}, "key", made_by)["seeds"]
    except ValueError as err:
        raise StudyError(f"RESULTS_DIR: {err}") from None
    if identity.get("format") != FORMAT:
        kind = identity.get("format")
        raise StudyError(f"RESULTS_DIR {results} holds a {kind} study; reproduce recomputes a seed study ({FORMAT})")
    if not 0 <= seed < identity["n"]:
        raise StudyError(f"--seed must be between 0 and {identity['n'] - 1} (the study's runs), not {seed}")
    profile = load_profile(str(profile_source(profile_name or identity["profile"])))
    if profile_hash(profile) != identity["profile_sha256"]:
        raise StudyError(
            f"profile {profile_name or identity['profile']} is not the one the study in {results} was made with "
            f"(its hash {identity['profile_sha256'][:12]}, now {profile_hash(profile)[:12]}): its runs cannot be redone"
        )
    found = [r for r in rows if isinstance(r, dict) and r.get("index") == seed]
    if len(found) != 1:
        raise StudyError(f"RESULTS_DIR: {results / 'seeds.json'} holds {len(found)} rows of seed {seed}, not one")
    return identity, found[0]


def committed_verdict_row(results: Path, seed: int) -> tuple[dict, dict]:
    """(the answer on test's declaration, its committed row of `seed`: {sft, each point: test
    success}), each argument checked."""
    try:
        declared = read_json_of_kind(results / "study.json", "study record", {"identity": dict}, "key",
                                     "`rlhf confirm-design --out DIR` writes it")["identity"]  # fmt: skip
        table = read_json_of_kind(results / "test_success.json", "per-seed test success", {"test_success": dict},
                                  "key", "rlhf.studies.verdict.success_table makes it")["test_success"]  # fmt: skip
    except ValueError as err:
        raise StudyError(f"RESULTS_DIR: {err}") from None
    n = declared["power"]["seeds"]
    if not 0 <= seed < n:
        raise StudyError(f"--seed must be between 0 and {n - 1} (the study's seeds), not {seed}")
    return declared, {name: values[seed] for name, values in table.items()}


def reproduce_verdict_seed(results: Path, seed: int, work: Path, say) -> tuple[dict, dict]:
    """(committed row, recomputed row) of seed `seed` of the answer on test in `results`."""
    from rlhf.studies import heldout, verdict

    declared, row = committed_verdict_row(results, seed)
    n, recipe = declared["power"]["seeds"], declared["sft_recipe"]
    folders = write_study_profiles(work, declared["profile"], n, verdict.VERDICT_STUDY_SEED, recipe)
    points = verdict.declared_points(declared)
    say(
        f"reproducing seed {seed} of {results} in {folders[seed]} (points: {', '.join(p.key for p in points.values())})"
    )
    heldout.run_points([folders[seed]], tuple(points.values()), declared["revision"], 1, say)
    table = verdict.success_table([folders[seed]], points)
    return row, {name: values[0] for name, values in table.items()}


def committed_nested_row(results: Path, seed: int) -> tuple[dict, dict]:
    """(a nested study's declaration, its committed row of pipeline `seed`: per point, its PPO
    seeds' differences and prompt variances (runs.json, rlhf.studies.nested.run_table))."""
    try:
        declared = read_json_of_kind(results / "study.json", "study record", {"identity": dict}, "key",
                                     "`rlhf nested --out DIR` writes it")["identity"]  # fmt: skip
        runs = read_json_of_kind(results / "runs.json", "nested runs", {"runs": dict}, "key",
                                 "rlhf.studies.nested.run_table makes it")["runs"]  # fmt: skip
    except ValueError as err:
        raise StudyError(f"RESULTS_DIR: {err}") from None
    n = declared["pipelines"]
    if not 0 <= seed < n:
        raise StudyError(f"--seed must be between 0 and {n - 1} (the study's pipelines), not {seed}")
    return declared, {label: rows[seed] for label, rows in runs.items()}


def reproduce_nested_seed(results: Path, seed: int, work: Path, say) -> tuple[dict, dict]:
    """(committed row, recomputed row) of pipeline `seed` of the nested study in `results`."""
    from rlhf.studies import heldout, nested
    from rlhf.studies.verdict import declared_points

    declared, row = committed_nested_row(results, seed)
    folders = write_study_profiles(work, declared["profile"], declared["pipelines"], declared["study_seed"],
                                   declared["sft_recipe"])  # fmt: skip
    points = declared_points(declared)
    arms, runs = nested.nested_arms(points)
    say(f"reproducing pipeline {seed} of {results} in {folders[seed]} ({len(runs)} PPO runs)")
    heldout.run_points([folders[seed]], tuple(runs.values()), declared["revision"], 1, say, arms=arms)
    table = nested.run_table([folders[seed]], points, runs)
    return row, {label: rows[0] for label, rows in table.items()}


def committed_frontier_row(results: Path, seed: int) -> tuple[dict, dict]:
    """(a frontier study's identity, its committed summary of seed `seed`: frontier.json's seeds[seed])."""
    from rlhf.studies.frontier.arms import settings_of

    try:
        result = read_json_of_kind(results / "frontier.json", "frontier summary", {"study": dict, "seeds": list},
                                   "key", "`rlhf frontier --out DIR` writes it")  # fmt: skip
    except ValueError as err:
        raise StudyError(f"RESULTS_DIR: {err}") from None
    identity = result["study"]
    if not 0 <= seed < identity["n"]:
        raise StudyError(f"--seed must be between 0 and {identity['n'] - 1} (the study's seeds), not {seed}")
    if any(a.c_from_grid for a in settings_of(identity).arms):
        raise StudyError(f"{results} has arms at the grid's best c, which needs every seed's grid: not one seed")
    return identity, result["seeds"][seed]


def reproduce_frontier_seed(results: Path, seed: int, work: Path, say) -> tuple[dict, dict]:
    """(committed row, recomputed row) of seed `seed` of the frontier study in `results`: the
    seed's SFT, judge and arms trained and measured on validation, summarised as the study was."""
    from rlhf.studies.frontier.arms import settings_of
    from rlhf.studies.frontier.selection import seed_summary
    from rlhf.studies.frontier.study import run_tasks

    identity, row = committed_frontier_row(results, seed)
    settings = settings_of(identity)
    folders = write_study_profiles(work, identity["profile"], identity["n"], identity["study_seed"],
                                   identity["sft_budget"])  # fmt: skip
    say(f"reproducing seed {seed} of {results} in {folders[seed]} ({len(settings.arms)} arms)")
    run_tasks([folders[seed]], settings.arms, identity["revision"], settings, 1, say)
    return row, seed_summary(seed, folders[seed], settings.arms)


def committed_room_row(results: Path, seed: int) -> tuple[dict, dict]:
    """(a room study's declaration, its committed row of `seed`: room.json's per_seed[seed], SFT's
    and the oracle's test success and their difference)."""
    try:
        room = read_json_of_kind(results / "room.json", "room study", {"declared": dict, "per_seed": list}, "key",
                                 "`rlhf confirm-oracle --out DIR` writes it")  # fmt: skip
    except ValueError as err:
        raise StudyError(f"RESULTS_DIR: {err}") from None
    n = room["declared"]["seeds"]
    if not 0 <= seed < n:
        raise StudyError(f"--seed must be between 0 and {n - 1} (the study's seeds), not {seed}")
    return room["declared"], room["per_seed"][seed]


def reproduce_room_seed(results: Path, seed: int, work: Path, say) -> tuple[dict, dict]:
    """(committed row, recomputed row) of seed `seed` of the room study in `results`."""
    from rlhf.studies import heldout, room

    declared, row = committed_room_row(results, seed)
    folders = write_study_profiles(work, declared["profile"], declared["seeds"], declared["study_seed"],
                                   declared["sft_recipe"])  # fmt: skip
    it = declared["oracle_iteration"]
    say(f"reproducing seed {seed} of {results} in {folders[seed]} (the oracle at {it})")
    heldout.run_points([folders[seed]], (heldout.Point("oracle", it),), declared["revision"], 1, say)
    return row, {**room.seed_rows([folders[seed]], it)[0], "seed": seed}


# What RESULTS_DIR holds, by the file that says so: a study rlhf reproduce recomputes one seed of
# (anything else is read as a seed study, whose checks name what is missing).
KINDS = {
    "test_success.json": (committed_verdict_row, reproduce_verdict_seed),
    "runs.json": (committed_nested_row, reproduce_nested_seed),
    "room.json": (committed_room_row, reproduce_room_seed),
    "frontier.json": (committed_frontier_row, reproduce_frontier_seed),
}


def code_that_ran(results: Path) -> str:
    """The code that trained and evaluated the committed study's runs."""
    for name in ("verdict.json", "nested.json", "room.json"):
        if (results / name).is_file():
            return read_json(results / name)["evaluated_by"]["code"]
    return read_json(results / "frontier.json")["study"]["code"]


def first_difference(committed, recomputed, path: str = "row") -> str | None:
    """None when the two are equal in canonical JSON (rlhf.io.dumps_json), else the first path
    where they part, with both values."""
    if dumps_json(committed) == dumps_json(recomputed):
        return None
    if isinstance(committed, dict) and isinstance(recomputed, dict):
        for key in sorted(set(committed) | set(recomputed)):
            if key not in committed or key not in recomputed:
                side = "the committed row" if key in committed else "the recomputed row"
                return f"{path}.{key}: only in {side}"
            found = first_difference(committed[key], recomputed[key], f"{path}.{key}")
            if found:
                return found
    if isinstance(committed, list) and isinstance(recomputed, list) and len(committed) == len(recomputed):
        for i, (a, b) in enumerate(zip(committed, recomputed)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
    return f"{path}: committed {committed!r}, recomputed {recomputed!r}"


def reproduce(results, seed: int, work=None, profile_name: str | None = None, say=print) -> dict:
    """Recompute seed `seed` of the seed study in `results` in `work` (default: a new temporary
    folder) and compare its row with the committed one; returns (and writes to
    work/reproduce-seed-N.json) {identical, first_difference, ...}. `profile_name`: the profile
    file of a study made with one (default: the profile the study names)."""
    results = Path(results)
    kind = next((KINDS[f] for f in KINDS if (results / f).is_file()), None)
    if kind is not None:
        kind[0](results, seed)  # checked before anything is written
    else:
        identity, row = committed_row(results, seed, profile_name)
    work = output_folder(work) if work is not None else Path(tempfile.mkdtemp(prefix="rlhf-reproduce-"))
    t0 = time.perf_counter()
    if kind is not None:
        row, recomputed = kind[1](results, seed, work, say)
        study_code = code_that_ran(results)
    else:
        folders = write_study_profiles(
            work, profile_name or identity["profile"], identity["n"], identity["study_seed"], identity["sft_budget"]
        )
        say(f"reproducing seed {seed} of {results} in {folders[seed]} (protocol: {row['protocol']})")
        run_seed(folders[seed], identity["revision"], row["protocol"], log=False)
        recomputed, study_code = seed_row(folders[seed], seed), identity["code"]
    first = first_difference(row, recomputed)
    out = {
        "results": str(results),
        "seed": seed,
        "identical": first is None,
        "first_difference": first,
        "study_code": study_code,
        **ran_with(),
        "arithmetic": runtime.identity_tag(),
        "seconds": time.perf_counter() - t0,
    }
    write_json(work / f"reproduce-seed-{seed}.json", out, overwrite=True)
    return out
