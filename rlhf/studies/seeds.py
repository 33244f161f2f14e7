"""Multi-seed studies: the whole embedded lab N times, varying every training seed.

`rlhf seeds --out DIR [--n 5] [--revision r001|r002] [--workers W] [--sft-budget NAME]`

Each study run i (0 <= i < n) gets its own profile, DIR/seed-i/profile.toml, whose training
seeds are derived from the profile's, the study seed and i (rlhf.studies.derivation); the
across-seed numbers are rlhf.studies.statistics', the changed-answer view
rlhf.studies.changed_answer's and the page rlhf.report.study's.

Running
-------
The interrupt/resume protocol runs in run 0 only; the other runs run each stage once. Runs go
to W worker processes (default: the cores), one torch thread each (the profile's runtime), a
fresh process per run; each writes its lab output to DIR/seed-i/lab.log, and the study prints a
line whenever a run finishes a stage. A killed study continues on rerun: a finished run (its
run.json records the report stage) is not reopened, an unfinished one continues as `rlhf lab`
does (rlhf.lab). A finished study (DIR/seeds.json there) recomputes nothing. Every argument is
checked before the study writes or prints anything (rlhf.studies.record); DIR/study.json records
the study's identity, the commit and the code it ran with.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

from rlhf import lab
from rlhf.config import load_profile
from rlhf.io import dumps_json, output_folder, read_json, sha256_text, write_json
from rlhf.report.study import write_study_report
from rlhf.studies import StudyError, log_to, outcome, stopped_error, worker_pool
from rlhf.studies.changed_answer import answer_kinds, changed_answer_view, study_answers
from rlhf.studies.derivation import DERIVATION, FIXED_SEEDS, TRAINING_SEEDS, profile_value, write_study_profiles
from rlhf.studies.record import begin_study, identity_of_study, workers_count
from rlhf.studies.sft_budget import budget_record
from rlhf.studies.statistics import INTERVAL, across_table, metric_bounds

FORMAT = "rlhf-seeds-1"
STAGES = ("sft", "judge", "ppo", "evaluate", "shortcut_audit", "report")
POPULATIONS = ("test", "probe_rows", "probe_contexts", "all_rows", "all_unique_contexts")


# ------------------------------------------------------------------------------ one run's row


def _sha_of(obj) -> str:

    return sha256_text(dumps_json(obj))


def seed_row(folder: Path, index: int) -> dict:
    """What one finished run contributes: its seeds, its numbers, and the hashes that show what
    differs between runs (trained states, data order) and what must not (corpus, prompts)."""
    profile = load_profile(str(folder / "profile.toml"))
    run = read_json(folder / "run.json")
    ev = read_json(folder / "evaluation" / "results.json")
    audit = read_json(folder / "shortcut_audit" / "results.json")
    ppo_history = read_json(folder / "ppo" / "history.json")
    metrics = {}
    for key in ("rubric_success", "learned_reward"):
        for pop in POPULATIONS:
            d = ev["differences"][key][pop]
            metrics.update(
                {f"{key}.{pop}.sft": d["sft"], f"{key}.{pop}.ppo": d["ppo"], f"{key}.{pop}.ppo_minus_sft": d["diff"]}
            )
    metrics["judge.test_accuracy"] = ev["judge_test"]["accuracy"]
    metrics.update({f"shortcut_audit.{k}": audit["counterfactuals"][k]["accuracy"] for k in audit["order"]})
    metrics.update({f"politeness.{k}": v for k, v in ev["politeness"]["counts"].items() if k != "contexts"})
    for policy in ("sft", "ppo"):
        for pop in ("test", "probe_rows"):
            m = ev["policies"][policy]["metrics"][pop]
            metrics[f"truncations.{pop}.{policy}"] = m["without_eos"]
            metrics[f"uncertified.{pop}.{policy}"] = m["uncertified"]
        test_rows = [r for r in ev["policies"][policy]["rows"] if r["population"] == "test"]
        metrics.update({f"answers.test.{policy}.{k}": v for k, v in answer_kinds(test_rows).items() if k != "rows"})
    prompt_ids = sorted(r["document_id"] for r in ev["policies"]["sft"]["rows"])
    return {
        "index": index,
        "folder": folder.name,
        "protocol": read_json(folder / "sft" / "resume_check.json")["protocol"],
        "seeds": {f"{t}.{k}": profile_value(profile, t, k) for t, k in TRAINING_SEEDS + FIXED_SEEDS},
        "sft_epochs": profile.sft.epochs,
        "metrics": metrics,
        "single_run_bootstrap": {
            f"{key}.{pop}": {"diff": ev["differences"][key][pop]["diff"], "ci95": ev["differences"][key][pop]["ci95"]}
            for key in ("rubric_success", "learned_reward")
            for pop in POPULATIONS
        },
        "identity": {
            "corpus_manifest_sha256": run["identity"]["corpus"],
            "evaluation_prompt_ids_sha256": _sha_of(prompt_ids),
            "evaluation_prompts": len(prompt_ids),
            "sft_state_sha256": run["stages"]["sft"]["sha256_final"],
            "judge_state_sha256": run["stages"]["judge"]["sha256_final"],
            "ppo_state_sha256": run["stages"]["ppo"]["sha256_final"],
            "ppo_rollout_order_sha256": _sha_of(ppo_history["consumed"]),
            "sft_first_update_loss": read_json(folder / "sft" / "history.json")["updates"][0]["loss"],
        },
    }


# ------------------------------------------------------------------------------ the study


def study_identity(profile_name: str, revision: str, n: int, study_seed: int, sft_budget: str) -> dict:
    return identity_of_study(
        FORMAT,
        "a seed study",
        profile_name,
        revision,
        n,
        study_seed,
        sft_budget,
        (2, " (across-seed statistics need 2)"),
    )


def run_complete(folder: Path) -> bool:
    path = folder / "run.json"
    return path.is_file() and "report" in read_json(path).get("stages", {})


def stages_done(folder: Path) -> list[str]:
    path = folder / "run.json"
    try:
        stages = read_json(path).get("stages", {}) if path.is_file() else {}
    except ValueError:  # never half-written (atomic), but be robust to a reader race
        return []
    return [s for s in STAGES if s in stages]


def run_seed(folder: str | Path, revision: str, protocol: bool, log: bool = True) -> str:
    """One run of the study: `rlhf lab` on the folder's own profile (in a worker process, its
    output goes to folder/lab.log)."""

    folder = Path(folder)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if log:
            log_to(folder / "lab.log", stack)
        ctx = lab.open_context(folder, load_profile(str(folder / "profile.toml")), revision=revision)
        lab.run_lab(ctx, protocol=protocol)
        print(f"run finished in {time.perf_counter() - t0:.1f} s", flush=True)
    return str(folder)


def _report_progress(folders: list[Path], seen: dict, t0: float, say) -> None:
    for i, folder in enumerate(folders):
        done = stages_done(folder)
        for stage in done[len(seen.get(i, [])) :]:
            say(
                f"seed {i}: {stage} complete ({STAGES.index(stage) + 1}/{len(STAGES)} stages) "
                f"at {time.perf_counter() - t0:.0f} s"
            )
        seen[i] = done


def run_all(folders: list[Path], revision: str, workers: int, say=print) -> None:
    """Run every unfinished run (protocol in run 0 only) over `workers` processes; workers = 1
    runs them here, one after another."""
    todo = [(i, f) for i, f in enumerate(folders) if not run_complete(f)]
    for i, f in enumerate(folders):
        if run_complete(f):
            say(f"seed {i}: already complete in {f} (not reopened)")
    t0 = time.perf_counter()
    seen = {i: stages_done(f) for i, f in enumerate(folders)}
    if workers == 1:
        for i, f in todo:
            say(f"seed {i}: running in {f}" + (" (with the interrupt/resume protocol)" if i == 0 else ""))
            run_seed(str(f), revision, i == 0, log=False)
            _report_progress(folders, seen, t0, say)
        return

    failed = []
    with worker_pool(workers) as pool:
        pending = {pool.submit(run_seed, str(f), revision, i == 0): i for i, f in todo}
        for i, f in todo:
            say(f"seed {i}: queued in {f} (log: {f / 'lab.log'})")
        while pending:
            done = pool.wait(pending)
            _report_progress(folders, seen, t0, say)
            for fut in done:
                i = pending.pop(fut)
                result = outcome(fut)
                if result is not None and result != "stopped":
                    failed.append(i)
                    say(f"seed {i}: FAILED: {result} (see {folders[i] / 'lab.log'})")
        if pool.stopping:
            raise stopped_error("each running seed")
    if failed:
        raise StudyError(f"runs {failed} failed; the others are kept. Run the same command again to continue")


def run_study(
    out,
    *,
    n: int = 5,
    revision: str = "r001",
    workers: int | None = None,
    sft_budget: str = "full",
    study_seed: int = 0,
    profile_name: str = "embedded",
    say=print,
) -> dict:
    """The whole study (module docstring); returns seeds.json's content."""

    out = output_folder(out)
    identity = study_identity(profile_name, revision, n, study_seed, sft_budget)
    workers = workers_count(workers)
    done = out / "seeds.json"
    finished = begin_study(out, identity, done, say, derivation=DERIVATION)
    if finished is not None:
        return finished
    t0 = time.perf_counter()
    folders = write_study_profiles(out, profile_name, n, study_seed, sft_budget)
    say(
        f"study {out}: {n} runs of the embedded lab on {revision}, SFT budget {sft_budget}, "
        f"{min(workers, n)} worker(s); seeds: {DERIVATION}"
    )
    run_all(folders, revision, min(workers, n), say)
    rows = [seed_row(f, i) for i, f in enumerate(folders)]
    check_invariants(rows)
    view = changed_answer_view(out, folders, revision)
    result = {
        "study": identity,
        "derivation": DERIVATION,
        "interval": INTERVAL,
        "command": study_command(out, identity),
        "sft_budget": budget_record(sft_budget),
        "seeds": rows,
        "across": across_table(rows, metric_bounds),
        "changed_answer": view,
        "wall_seconds_this_invocation": time.perf_counter() - t0,
        "lab_seconds": {r["folder"]: lab_seconds(f) for r, f in zip(rows, folders)},
    }

    write_json(out / "answers.json", study_answers(folders), keep_existing=True)
    write_study_report(out, result)
    write_json(done, result)
    say(f"study complete: {done} and {out / 'report.html'}")
    return result


def lab_seconds(folder: Path) -> float | None:
    """Wall seconds of the run's last lab invocation, from its log (None when run in-process)."""
    log = folder / "lab.log"
    if not log.is_file():
        return None
    found = re.findall(r"^run finished in ([0-9.]+) s$", log.read_text(), flags=re.M)
    return float(found[-1]) if found else None


def study_command(out: Path, identity: dict) -> str:
    cmd = f"rlhf seeds --out {out} --n {identity['n']} --revision {identity['revision']}"
    if identity["sft_budget"] != "full":
        cmd += f" --sft-budget {identity['sft_budget']}"
    if identity["study_seed"]:
        cmd += f" --study-seed {identity['study_seed']}"
    if identity["profile"] != "embedded":
        cmd += " --profile PROFILE.toml"
    return cmd


def check_invariants(rows: list[dict]) -> None:
    """Runs must agree on the corpus and the held-out prompts, and differ in every training seed
    and trained state (else they are not independent draws)."""
    for key in ("corpus_manifest_sha256", "evaluation_prompt_ids_sha256"):
        if len({r["identity"][key] for r in rows}) != 1:
            raise StudyError(f"the runs of a study differ in {key}: they must share corpus and prompts")
    for key in ("sft_state_sha256", "judge_state_sha256", "ppo_state_sha256"):
        if len({r["identity"][key] for r in rows}) != len(rows):
            raise StudyError(f"two runs of the study share {key}: their seeds did not reach training")
    for t, k in TRAINING_SEEDS:
        if len({r["seeds"][f"{t}.{k}"] for r in rows}) != len(rows):
            raise StudyError(f"two runs share the training seed {t}.{k}")
