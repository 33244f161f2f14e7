"""Multi-seed studies: the whole embedded lab N times, varying every training seed.

`rlhf seeds --out DIR [--n 5] [--revision r001|r002] [--workers W] [--sft-budget NAME]`

What varies and what does not
-----------------------------
Each study run i (0 <= i < n) gets its own profile, written to DIR/seed-i/profile.toml, so
that the run is reproducible from its folder alone:

    rlhf lab --out DIR/seed-i --profile DIR/seed-i/profile.toml --revision REV

Every *training* seed (``TRAINING_SEEDS``: the global torch seed, the actor's and the judge's
LoRA init, the judge head, the data order of SFT/judge/PPO, PPO sampling) is derived from the
profile's own value, the study seed S and the run index i by ``derived_seed``:

    seed = profile seed + 100000 * S + 1000 * i

so run 0 of study seed 0 is exactly the profile's single run (the lab run of docs/results.md), two runs of a
study never share a seed (the profile's seeds differ by less than 1000), and two study seeds
never share one (n <= 100). The evaluation seed (349, ``FIXED_SEEDS``) and the corpus seed (49,
the corpus revision's own) are kept: every run sees the same corpus, the same held-out prompts and the same
bootstrap draws. The embedded base is built from its fixed seed 49 in every run (the
"pre-trained" model is not a training seed of RLHF). ``seed_changes`` is the one function that
says which profile entries are set.

`--sft-budget NAME` replaces the profile's SFT epochs by a named budget of ``rlhf.sft_budget.SFT_BUDGETS``; the
budget of question (b) is chosen on validation prompts only by `rlhf choose-sft-budget`
(rlhf.sft_budget).

Running
-------
The interrupt/resume protocol runs in run 0 only; the other runs run each stage once. Runs go
to W worker processes (default: the cores), one torch thread each (the profile's runtime), a
fresh process per run; each writes its lab output to DIR/seed-i/lab.log, and the study prints a
line whenever a run finishes a stage. A killed study continues on rerun: a finished run (its
run.json records the report stage) is not reopened, an unfinished one continues as `rlhf lab`
does (rlhf.lab). A finished study (DIR/seeds.json there) recomputes nothing.

Across seeds
------------
``across_seeds(values)``: n, mean, sample SD, a 95% Student-t interval over seeds, the count of
positive / negative / zero values, and the exact two-sided sign-test p. The t-interval treats the
n runs as independent draws of training randomness (init, order, sampling) with a roughly normal
spread of outcomes, for this corpus and these held-out prompts; with n = 5 it has 4 degrees of
freedom (t = 2.776), so it is wide, and it is only as good as that normality assumption (the
sign count needs none). It says how much the conclusion depends on the draw of training seeds;
the single-run bootstrap intervals (rlhf.evaluate) resample prompts within one trained run and
say nothing about that.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import re
import time
import tomllib
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch

from rlhf import lab
from rlhf.config import (
    PROFILE_DIR,
    PROFILES,
    Profile,
    load_profile,
    override,
    profile_from_dict,
    profile_hash,
    profile_text_with,
)
from rlhf.corpus import load_corpus
from rlhf.evaluate import evaluation_roles
from rlhf.identities import code_sha256, describe_change
from rlhf.io import dumps_json, read_json, sha256_text, write_json, write_text
from rlhf.report.study import write_study_report
from rlhf.scoring import response_logprobs
from rlhf.sft_budget import budget_changes, budget_record
from rlhf.tokens import collate, encode_prompt

FORMAT = "rlhf-seeds-1"
# (table, key) of every training seed; all live in the profile's [seeds] table. The corpus seed
# (49) is the corpus revision's own (rlhf.corpus.REVISIONS), not a profile entry.
TRAINING_SEEDS = (
    ("seeds", "torch"),
    ("seeds", "lora"),
    ("seeds", "judge_lora"),
    ("seeds", "judge_head"),
    ("seeds", "data_order"),
    ("seeds", "ppo_sampling"),
)
FIXED_SEEDS = (("seeds", "evaluation"),)
RUN_STRIDE = 1000
STUDY_STRIDE = 100_000
MAX_RUNS = STUDY_STRIDE // RUN_STRIDE
DERIVATION = (
    "training seed of run i = the profile's value + 100000 * study_seed + 1000 * i, for "
    + ", ".join(f"{t}.{k}" for t, k in TRAINING_SEEDS)
    + "; kept: "
    + ", ".join(f"{t}.{k}" for t, k in FIXED_SEEDS)
    + " and the corpus seed 49"
)

STAGES = ("sft", "judge", "ppo", "evaluate", "shortcut_audit", "report")
POPULATIONS = ("test", "probe_rows", "probe_contexts", "all_rows", "all_unique_contexts")
INTERVAL = {
    "name": "95% Student-t interval over seeds",
    "formula": "mean ± t(0.975, n−1) · SD / √n, SD the sample standard deviation (n − 1)",
    "assumption": (
        "the n runs are independent draws of the training randomness (adapter and head init, "
        "data order, PPO sampling) with a roughly normal spread of outcomes; corpus, base and "
        "held-out prompts are the same in every run"
    ),
    "meaning": (
        "where the mean over training seeds plausibly lies, for this corpus and these prompts. With "
        "n = 5 (4 degrees of freedom, t = 2.776) it is wide and leans on normality; the count of "
        "seeds with a positive difference and the sign-test p need no such assumption. It is not "
        "the single-run bootstrap interval, which resamples prompts inside one trained run."
    ),
}


class StudyError(ValueError):
    """A study folder or its arguments are not what the study needs."""


# ------------------------------------------------------------------------------ seeds and profiles


def derived_seed(profile_seed: int, study_seed: int, index: int) -> int:
    """The training seed of run `index` of study `study_seed` (module docstring)."""
    return profile_seed + STUDY_STRIDE * study_seed + RUN_STRIDE * index


def profile_value(profile: Profile, table: str, key: str):
    return getattr(getattr(profile, table), key)


def seed_changes(profile: Profile, study_seed: int, index: int) -> dict[tuple[str, str], int]:
    """{(table, key): seed} for every training seed of run `index`: the one place that sets them."""
    if not 0 <= index < MAX_RUNS:
        raise StudyError(f"run index {index} outside 0..{MAX_RUNS - 1} (seeds would collide)")
    if study_seed < 0:
        raise StudyError(f"study seed must be >= 0, not {study_seed}")
    return {(t, k): derived_seed(profile_value(profile, t, k), study_seed, index) for t, k in TRAINING_SEEDS}


def expected_profile(profile: Profile, name: str, changes: dict) -> Profile:
    """The profile that `profile_text_with` must produce (what the written file is checked against)."""
    return override(profile, {(None, "name"): name, **changes})


def profile_source(profile_name: str) -> Path:
    path = PROFILE_DIR / f"{profile_name}.toml" if profile_name in PROFILES else Path(profile_name)
    if not path.is_file():
        raise StudyError(f"no profile file {path}")
    return path


def write_run_profile(path, base_text: str, name: str, changes: dict) -> Profile:
    """Write the run's profile TOML (never overwriting a different one) and return it, read back
    with load_profile and checked to equal the intended profile."""

    want = expected_profile(profile_from_dict(tomllib.loads(base_text)), name, changes)
    text = profile_text_with(base_text, name, changes)
    path = Path(path)
    if path.is_file() and path.read_text() != text:
        raise StudyError(f"{path} exists with other content: this folder belongs to another study")
    write_text(path, text, keep_existing=True)
    got = load_profile(str(path))
    if got != want:
        raise StudyError(f"{path}: the written profile does not read back as intended")
    return got


# ------------------------------------------------------------------------------ statistics

# t(0.975, df) for df = 1..30 (standard tables; tests recompute them by integrating the density).
T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (normal 1.960 beyond 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {df}")
    return T975[df - 1] if df <= len(T975) else 1.960


def sign_test_p(positive: int, negative: int) -> float:
    """Exact two-sided sign-test p of `positive` vs `negative` (zeros dropped), Binomial(n, 1/2)."""
    n = positive + negative
    if n == 0:
        return 1.0
    k = min(positive, negative)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def across_seeds(values: list[float]) -> dict:
    """Mean, sample SD, 95% t-interval over seeds, sign counts and sign-test p of per-seed values."""
    if not values or any(
        not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) for v in values
    ):
        raise StudyError(f"across-seed statistics need finite numbers, got {values}")
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    half = t975(n - 1) * sd / math.sqrt(n) if n > 1 else None
    positive, negative = sum(v > 0 for v in values), sum(v < 0 for v in values)
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "t95": [mean - half, mean + half] if half is not None else None,
        "positive": positive,
        "negative": negative,
        "zero": n - positive - negative,
        "sign_test_p": sign_test_p(positive, negative),
        "min": min(values),
        "max": max(values),
    }


def across_table(rows: list[dict]) -> dict:
    """{metric: across_seeds(its per-seed values)} over every metric the rows share."""
    keys = sorted(set.intersection(*(set(r["metrics"]) for r in rows)))
    return {k: across_seeds([r["metrics"][k] for r in rows]) for k in keys}


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

    base = load_profile(profile_name)
    if base.model.kind != "embedded":
        raise StudyError(f"a seed study runs the embedded lab, not profile {base.name}")
    if not 2 <= n <= MAX_RUNS:
        raise StudyError(f"--n must be between 2 and {MAX_RUNS} (across-seed statistics need 2), not {n}")
    budget_changes(base, sft_budget)  # refuses an unknown name
    return {
        "format": FORMAT,
        "profile": base.name,
        "profile_sha256": profile_hash(base),
        "revision": revision,
        "n": n,
        "study_seed": study_seed,
        "sft_budget": sft_budget,
        "code": code_sha256(),
    }


def _check_study_record(out: Path, identity: dict) -> None:
    path = out / "study.json"
    if not path.is_file():
        write_json(path, {"identity": identity, "derivation": DERIVATION})
        return
    change = describe_change(read_json(path)["identity"], identity)
    if change:
        raise StudyError(
            f"refusing to continue the study in {out}: {change}. "
            f"Nothing was written; use a new --out folder for another study"
        )


def run_folders(out: Path, n: int) -> list[Path]:
    return [out / f"seed-{i}" for i in range(n)]


def prepare_runs(out: Path, profile_name: str, identity: dict) -> list[Path]:
    """Write every run's profile.toml (checked on a rerun); return the run folders."""
    base_text = profile_source(profile_name).read_text()
    base = load_profile(str(profile_source(profile_name)))
    folders = run_folders(out, identity["n"])
    budget = budget_changes(base, identity["sft_budget"])
    for i, folder in enumerate(folders):
        name = f"{base.name}-study{identity['study_seed']}-seed{i}"
        if identity["sft_budget"] != "full":
            name += f"-{identity['sft_budget']}"
        write_run_profile(
            folder / "profile.toml", base_text, name, {**seed_changes(base, identity["study_seed"], i), **budget}
        )
    return folders


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


def run_seed(folder: str, revision: str, protocol: bool, log: bool = True) -> str:
    """One run of the study: `rlhf lab` on the folder's own profile (in a worker process, its
    output goes to folder/lab.log)."""

    folder = Path(folder)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if log:
            f = stack.enter_context(open(folder / "lab.log", "a", buffering=1))
            stack.enter_context(contextlib.redirect_stdout(f))
            stack.enter_context(contextlib.redirect_stderr(f))
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
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1
    ) as pool:
        pending = {pool.submit(run_seed, str(f), revision, i == 0): i for i, f in todo}
        for i, f in todo:
            say(f"seed {i}: queued in {f} (log: {f / 'lab.log'})")
        while pending:
            done, _ = wait(pending, timeout=10, return_when=FIRST_COMPLETED)
            _report_progress(folders, seen, t0, say)
            for fut in done:
                i = pending.pop(fut)
                if fut.exception() is not None:
                    failed.append(i)
                    say(f"seed {i}: FAILED: {fut.exception()} (see {folders[i] / 'lab.log'})")
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

    out = Path(out)
    identity = study_identity(profile_name, revision, n, study_seed, sft_budget)
    done = out / "seeds.json"
    if done.is_file():
        result = read_json(done)
        if result["study"] != identity:
            _check_study_record(out, identity)  # names what differs
        say(f"study already complete in {out} (seeds.json): nothing recomputed")
        return result
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    _check_study_record(out, identity)
    folders = prepare_runs(out, profile_name, identity)
    workers = workers or os.cpu_count() or 1
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
        "across": across_table(rows),
        "changed_answer": view,
        "wall_seconds_this_invocation": time.perf_counter() - t0,
        "lab_seconds": {r["folder"]: lab_seconds(f) for r, f in zip(rows, folders)},
    }

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


# ------------------------------------------------------------------------------ a changed answer


def pick_changed_row(sft_rows: list[dict], ppo_rows: list[dict]) -> tuple[dict, dict] | None:
    """The first test prompt whose greedy PPO answer differs from SFT's, preferring one where PPO
    turned a rubric failure into a success, then a success into a failure; None if none changed."""
    ppo_by_id = {r["document_id"]: r for r in ppo_rows}
    changed = [
        (s, ppo_by_id[s["document_id"]])
        for s in sft_rows
        if s["population"] == "test" and s["response_ids"] != ppo_by_id[s["document_id"]]["response_ids"]
    ]
    if not changed:
        return None

    def rank(pair):
        s, p = pair[0]["rubric"]["rubric_success"], pair[1]["rubric"]["rubric_success"]
        return 0 if (p and not s) else 1 if (s and not p) else 2

    return min(changed, key=rank)


def changed_answer_view(out: Path, folders: list[Path], revision: str) -> dict:
    """Per-token view (first run that has one) of a held-out answer PPO changed; computed once and
    kept in seed-i/changed_answer.json."""
    for i, folder in enumerate(folders):
        path = folder / "changed_answer.json"
        if path.is_file():
            return read_json(path)
        ev = read_json(folder / "evaluation" / "results.json")
        pair = pick_changed_row(ev["policies"]["sft"]["rows"], ev["policies"]["ppo"]["rows"])
        if pair is None:
            continue
        view = {"seed": i, "folder": folder.name, **token_view_of(folder, revision, *pair)}
        write_json(path, view, keep_existing=True)
        return read_json(path)
    return {"seed": None, "note": "PPO changed no greedy answer to a test prompt in any run"}


def token_view_of(folder: Path, revision: str, sft_row: dict, ppo_row: dict) -> dict:
    """Teacher-forced log-probs of each token of PPO's answer under the PPO actor and under the SFT
    policy (PPO's frozen reference), beside SFT's own answer and both rubric verdicts."""

    # Read-only: a finished run's files, hash-checked as they load (corpus, roles); not reopened
    # through lab.open_context, so that a later code version can still read it.
    corpus = load_corpus(folder / "corpus")
    if corpus.revision != revision:
        raise StudyError(f"{folder} holds corpus {corpus.revision}, not {revision}")
    ctx = lab.Context(folder, load_profile(str(folder / "profile.toml")), folder / "base_model", corpus)
    roles = evaluation_roles(ctx)
    prompt = encode_prompt(ctx.tokenizer, ppo_row["prompt"], ctx.profile.limits, ppo_row["document_id"])
    batch = collate([prompt], [ppo_row["response_ids"]], ctx.pad_id)
    with torch.no_grad():
        logp_ppo = response_logprobs(roles["ppo"].model, batch)[0].tolist()  # [R]
        logp_sft = response_logprobs(roles["reference"].model, batch)[0].tolist()  # [R]
    tokens = ctx.tokenizer.convert_ids_to_tokens(ppo_row["response_ids"])
    return {
        "document_id": ppo_row["document_id"],
        "prompt": ppo_row["prompt"],
        "sft": {k: sft_row[k] for k in ("response", "finish_reason", "learned_reward")}
        | {"rubric_success": sft_row["rubric"]["rubric_success"], "reason": sft_row["rubric"]["reason"]},
        "ppo": {k: ppo_row[k] for k in ("response", "finish_reason", "learned_reward")}
        | {"rubric_success": ppo_row["rubric"]["rubric_success"], "reason": ppo_row["rubric"]["reason"]},
        "tokens": [
            {"token": t, "logp_ppo": a, "logp_sft": b, "log_ratio": a - b}
            for t, a, b in zip(tokens, logp_ppo, logp_sft)
        ],
    }
