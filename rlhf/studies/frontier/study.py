"""`rlhf frontier`: the study's orchestration. Its record (study.json), one folder per seed with
its own profile, the seeds' preparation and the arms' runs over worker processes, an extension
by new arms, and the summary of the stored measurements (rlhf.studies.frontier.selection)
written to frontier.json and report.html, or recomputed into a new folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

from rlhf import designs
from rlhf.config import load_profile
from rlhf.identities import code_sha256
from rlhf.io import output_folder, read_json, write_json
from rlhf.studies import StudyError, outcome, stopped_error, worker_pool
from rlhf.studies.derivation import write_study_profiles
from rlhf.studies.frontier.arms import GRID, Arm, Settings, default_arms, grid_arms, resolved, settings_of
from rlhf.studies.frontier.measure import arm_complete, arm_trained, prepare_seed, run_arm
from rlhf.studies.frontier.selection import collect, grid_choice
from rlhf.studies.record import begin_study, identity_of_study, ran_with, workers_count

FORMAT = "rlhf-frontier-1"
STUDY_SEED = 1


def study_identity(
    profile_name: str, revision: str, n: int, sft_budget: str, settings: Settings, study_seed: int
) -> dict:
    ident = identity_of_study(FORMAT, "the frontier", profile_name, revision, n, study_seed, sft_budget)
    return {**ident, "settings": settings.record()}


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
    ones it extends (`extended_from`) with what the extension runs with (commit and code), and a
    summary of the old arms (frontier.json, report.html)
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
    write_json(path, {**extended, **ran_with()}, overwrite=True)
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


def run_tasks(
    folders: list[Path], arms: tuple[Arm, ...], revision: str, settings: Settings, workers: int, say, *, confirm=False
) -> None:
    """Every seed's preparation, then its arms, over `workers` processes (1: here, in order)."""
    profile = load_profile(str(folders[0] / "profile.toml"))
    measure = not confirm
    ensemble = any(designs.design(a.design).ensemble for a in arms)  # the seed trains the members these arms use
    todo_arms = {
        i: [a for a in arms if not (arm_complete(f, a, profile) if measure else arm_trained(f, a))]
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
    failed, stopped = [], []
    with worker_pool(workers) as pool:
        pending: dict = {
            pool.submit(prepare_seed, str(f), revision, settings, confirm=confirm, ensemble=ensemble): ("seed", i, None)
            for i, f in enumerate(folders)
        }
        say(f"{len(folders)} seed(s) queued; logs in seed-i/frontier.log and seed-i/arms/ARM/lab.log")
        while pending:
            for fut in pool.wait(pending):
                kind, i, arm = pending.pop(fut)
                what = f"seed {i}" + (f", arm {arm.name}" if arm else ": SFT, judge and the SFT measurements")
                result = outcome(fut)
                if result == "stopped":
                    stopped.append(what)
                    continue
                if result is not None:
                    failed.append(what)
                    say(f"{what}: FAILED: {result}")
                    continue
                say(f"{what}: done at {time.perf_counter() - t0:.0f} s")
                if kind == "seed" and not pool.stopping:
                    for a in todo_arms[i]:
                        pending[pool.submit(run_arm, str(folders[i]), a, revision, settings, measure=measure)] = (
                            "arm",
                            i,
                            a,
                        )
        if pool.stopping:
            raise stopped_error(f"the study's running tasks ({len(stopped)} stopped)")
    if failed:
        raise StudyError(f"{', '.join(failed)} failed; the rest is kept. Run the same command again to continue")


def run_frontier(
    out,
    *,
    n: int = 3,
    revision: str = "r002",
    sft_budget: str = "sft-e6",
    workers: int | None = None,
    profile_name: str = "embedded",
    settings: Settings = Settings(),
    say=print,
    study_seed: int = STUDY_SEED,
) -> dict:
    """The whole validation study (rlhf.studies.frontier); returns frontier.json's content.
    `study_seed`: the frontier's own (STUDY_SEED), or another for a study of fresh seeds on
    validation (rlhf.studies.choice estimates a chosen point there)."""
    t0 = time.perf_counter()
    out = output_folder(out)
    identity = study_identity(profile_name, revision, n, sft_budget, settings, study_seed)
    workers = workers_count(workers)
    done = out / "frontier.json"
    extend_study(out, identity, say)
    finished = begin_study(out, identity, done, say)
    if finished is not None:
        return finished
    folders = write_study_profiles(out, profile_name, n, study_seed, sft_budget)
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
    """The `rlhf frontier` command that makes this study; for arms no command's options choose (the
    SFT-budget rule's oracle study, a library caller's settings), a line that says so instead."""
    cmd = f"rlhf frontier --out {out} --n {identity['n']} --revision {identity['revision']}"
    if identity["study_seed"] != STUDY_SEED:
        return f"no rlhf frontier command runs study seed {identity['study_seed']} (rlhf.studies.choice does)"
    cmd += f" --sft-budget {identity['sft_budget']}"
    cmd += "" if identity["profile"] == "embedded" else " --profile PROFILE.toml"
    settings = settings_of(identity)
    if any(a.method != "ppo" for a in settings.arms):
        return "no rlhf frontier command runs DPO or GRPO arms (rlhf compare-methods does)"
    grid = tuple(cast(float, a.c) for a in grid_arms(settings.arms))
    if not grid or settings != Settings(arms=default_arms(grid)):
        names = ", ".join(a.name for a in settings.arms)
        return f"no rlhf frontier command makes these arms alone ({names}); `{cmd}` extends the study to its arms"
    return cmd + ("" if grid == GRID else " --grid " + ",".join(f"{c:g}" for c in grid))
