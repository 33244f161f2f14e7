"""What a study is, every argument checked before anything is written, and its record (study.json).

`rlhf seeds`, `rlhf frontier` (its `--confirm` too) and `rlhf choose-sft-budget` check all their
arguments before their first file is written and before they print the TensorBoard line: a bad
one is refused with one line naming its option, and the folder is left as it was.

    identity_of_study   what a study over N runs of the embedded lab is (a rerun must match it),
                        each part checked: profile kind, N (check_runs), study seed, SFT budget
    check_runs          a count of runs (N, --confirm) within its bounds
    workers_count       the worker processes it runs on (--workers, at least 1; default: the cores)
    ran_with            what a study ran with: the commit of the checkout and the code identity
    refuse_change       a rerun whose identity is not the recorded one, refused naming what changed
    open_record         study.json: written on first use with the identity and what the study ran
                        with (`ran_with`: the commit and the code identity); on a rerun the
                        identities compared, a change refused naming it, nothing written
    begin_study         a finished study's summary, or the record opened and the TensorBoard line said
"""

from __future__ import annotations

import os
from pathlib import Path

from rlhf.config import load_profile, profile_hash
from rlhf.events import logdir_line
from rlhf.identities import code_sha256, describe_change, git_commit
from rlhf.io import read_json, write_json
from rlhf.studies import StudyError
from rlhf.studies.derivation import MAX_RUNS, SFT_RECIPES, check_study_seed


def identity_of_study(
    fmt: str, kind: str, profile_name: str, revision: str, n: int, study_seed: int, sft_budget: str, least=(1, "")
) -> dict:
    """What a study over N runs of the embedded lab is: its format, the profile and its hash, the
    revision, N, the study seed, the SFT budget and the code. `least`: (the smallest N, why);
    refuses another profile kind, an N out of range, a study seed whose runs' seeds torch cannot
    take, an unknown budget."""
    base = load_profile(profile_name)
    if base.model.kind != "embedded":
        raise StudyError(f"{kind} runs the embedded lab, not profile {base.name}")
    check_runs(n, "--n", least)
    check_study_seed(base, study_seed)
    if sft_budget not in SFT_RECIPES:
        raise StudyError(f"--sft-budget must be one of {', '.join(SFT_RECIPES)}, not {sft_budget!r}")
    return {
        "format": fmt,
        "profile": base.name,
        "profile_sha256": profile_hash(base),
        "revision": revision,
        "n": n,
        "study_seed": study_seed,
        "sft_budget": sft_budget,
        "code": code_sha256(),
    }


def check_runs(n: int, option: str, least=(1, "")) -> None:
    """A study's number of runs (its `option`): from least[0] (least[1] says why) to MAX_RUNS."""
    if not least[0] <= n <= MAX_RUNS:
        raise StudyError(f"{option} must be between {least[0]} and {MAX_RUNS}{least[1]}, not {n}")


def workers_count(workers: int | None) -> int:
    """--workers: the worker processes of a study, at least 1; None: one per core."""
    if workers is None:
        return os.cpu_count() or 1
    if workers < 1:
        raise StudyError(f"--workers must be at least 1 (or left out: one per core), not {workers}")
    return workers


def ran_with() -> dict:
    """What a study ran with: the commit of the checkout (None outside one) and the code identity."""
    return {"commit": git_commit(), "code": code_sha256()}


def refuse_change(out: Path, recorded: dict, identity: dict) -> None:
    """Refuse to continue the study in `out` when its recorded identity is not `identity`."""
    change = describe_change(recorded, identity)
    if change:
        raise StudyError(
            f"refusing to continue the study in {out}: {change}. "
            f"Nothing was written; use a new --out folder for another study"
        )


def open_record(out: Path, identity: dict, **parts) -> None:
    """out/study.json: on first use {identity, **parts, commit, code} (ran_with); on a rerun the
    recorded identity must equal `identity`, else the study is refused naming what changed, and
    nothing is written."""
    path = out / "study.json"
    if path.is_file():
        refuse_change(out, read_json(path)["identity"], identity)
        return
    write_json(path, {"identity": identity, **parts, **ran_with()})


def begin_study(out: Path, identity: dict, done: Path, say, **parts) -> dict | None:
    """Where every study starts once its arguments are checked: a finished one (its summary `done`
    there) returns that summary and recomputes nothing (refused if its identity is not this one);
    otherwise the folder gets its record (open_record), the TensorBoard line is said, and None."""
    if done.is_file():
        result = read_json(done)
        refuse_change(out, result["study"], identity)
        say(f"study already complete in {out} ({done.name}): nothing recomputed")
        return result
    out.mkdir(parents=True, exist_ok=True)
    open_record(out, identity, **parts)
    say(logdir_line(out))
    return None
