"""Choosing the cut SFT budget of question (b) on validation prompts only (docs/studies.md).

`rlhf choose-sft-budget --out FILE.json --work DIR [--revision r002]`

Rule, fixed before measuring: among the named budgets of SFT_BUDGETS (all but
`full`: 1 to 10 epochs), the smallest whose greedy *validation* rubric success lies in
[0.3, 0.8] (the profile's own seeds, i.e. run 0 of study seed 0). Without `--budgets`, every
candidate is trained and measured, so the file shows the whole curve, not only the chosen point.
`--budgets` measures some, and `--previous FILE` takes the candidates an earlier record measured
(same revision and profile; each candidate keeps the code hash it was measured with) instead of
training them again; a budget is chosen only when every smaller candidate was measured. Every
argument is checked before the corpus or the base is made; the record keeps the commit and the
code it ran with.

No test prompt can inform it: the corpus is prepared in the work folder and only its
*learning view* (rlhf.corpus.LearningView: train demonstrations, train/validation pairs,
rollout prompts; it refuses test inputs, probes and gold labels) is handed to the code that
trains and measures. The validation prompts are the prompts of the 180 validation pairs; the
action a prompt calls for is read from the pair's chosen answer (every chosen answer is a rubric
success; checked), not from a label.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

from rlhf.config import Profile, load_profile, override, profile_hash
from rlhf.corpus import LearningView, load_corpus, prepare
from rlhf.embedded import build_embedded
from rlhf.identities import code_sha256
from rlhf.io import output_folder, read_json_of_kind, write_json
from rlhf.models import check_tokenizer, directory_identity, load_tokenizer
from rlhf.roles import new_role
from rlhf.runtime import configure_torch, seed_system_rngs
from rlhf.sft import train_sft
from rlhf.studies import StudyError
from rlhf.studies.derivation import EPOCH_BUDGETS, SFT_BUDGETS, budget_changes
from rlhf.studies.record import ran_with
from rlhf.studies.validation import validation_rubric_success

LOW, HIGH = 0.3, 0.8


RULE = (
    f"the smallest named budget (rlhf.sft_budget.SFT_BUDGETS, 'full' excluded) whose greedy validation rubric "
    f"success lies in [{LOW}, {HIGH}], measured with the profile's own seeds"
)


def candidate_budgets() -> list[str]:
    return sorted(EPOCH_BUDGETS, key=lambda k: EPOCH_BUDGETS[k])


def budget_record(name: str) -> dict:
    return {
        "name": name,
        "epochs": SFT_BUDGETS[name],
        "candidates": candidate_budgets(),
        "rule": RULE,
        "note": "epochs None: the profile's own SFT budget",
    }


def measure_budget(view: LearningView, model_dir: Path, profile: Profile, tokenizer, eos_id: int, pad_id: int) -> dict:
    """Train SFT with `profile`'s budget on the learning view; its greedy validation success."""

    t0 = time.perf_counter()
    actor = new_role("actor", profile, model_dir, base_identity={"files": directory_identity(model_dir)})
    seed_system_rngs(profile.seeds.torch)  # as rlhf.lab.train_role
    state = train_sft(actor, view, tokenizer, eos_id, pad_id, profile)
    actor.model.eval()
    reader = SimpleNamespace(tokenizer=tokenizer, eos_id=eos_id, pad_id=pad_id, profile=profile)  # what answers read
    return {
        "updates": state["step"],
        "train_seconds": time.perf_counter() - t0,
        "last_validation_loss": state["history"]["epochs"][-1]["validation_loss"],
        "validation": validation_rubric_success(actor.model, view, reader),
    }


def choose(measured: list[dict], order: list[str] | None = None) -> str | None:
    """The rule: the smallest candidate inside [LOW, HIGH], in `order` (default: as measured);
    None when none is, or when a smaller candidate of `order` was not measured."""
    by_name = {m["budget"]: m for m in measured}
    for name in order or [m["budget"] for m in measured]:
        if name not in by_name:
            return None
        if LOW <= by_name[name]["validation"]["rubric_success"] <= HIGH:
            return name
    return None


def check_budgets(budgets: list[str] | None) -> list[str]:
    """--budgets: names among the candidates (candidate_budgets, 'full' excluded); None: all of them."""
    if budgets is None:
        return candidate_budgets()
    unknown = [b for b in budgets if b not in EPOCH_BUDGETS]
    if unknown or not budgets:
        raise StudyError(
            f"--budgets takes names among {', '.join(candidate_budgets())}, not {', '.join(map(repr, unknown))}"
        )
    return budgets


# What a record of this command holds (`--previous FILE` must be one).
RECORD_KEYS = {"revision": str, "profile_sha256": str, "command": str, "candidates": list}


def previous_candidates(paths, revision: str, profile: Profile) -> list[dict]:
    """Candidates measured by earlier records of the same revision and profile (each keeps the
    command and the code hash it was measured with); a file that is not such a record, or one of
    another revision or profile, is refused naming it."""
    out = []
    for path in paths or []:
        try:
            rec = read_json_of_kind(
                path, "choose-sft-budget record", RECORD_KEYS, "keys", "`rlhf choose-sft-budget --out FILE` writes one"
            )
        except ValueError as err:
            raise StudyError(f"--previous: {err}") from None
        if not all(isinstance(m, dict) and m.get("budget") in EPOCH_BUDGETS for m in rec["candidates"]):
            raise StudyError(f"--previous: {path} is not a choose-sft-budget record: a candidate is not a named budget")
        if (rec["revision"], rec["profile_sha256"]) != (revision, profile_hash(profile)):
            raise StudyError(f"--previous: {path} was measured on another revision or profile; measure again")
        out += [
            {**m, "measured_by": m.get("measured_by", rec["command"]), "code": m.get("code", rec.get("code"))}
            for m in rec["candidates"]
        ]
    return out


def prepare_work(work: Path, revision: str, profile: Profile):
    """The corpus and the embedded base in `work` (each made once); the learning view, the
    tokenizer and its EOS and PAD ids."""
    if not (work / "corpus" / "manifest.json").is_file():
        prepare(work / "corpus", revision=revision)
    view = load_corpus(work / "corpus").learning_view()  # the only corpus object kept: no test input
    if view.revision != revision:
        raise StudyError(f"{work} holds corpus {view.revision}, not {revision}: use a new --work folder")
    if not (work / "base_model" / "config.json").is_file():
        build_embedded(work / "base_model")
    tokenizer = load_tokenizer(work / "base_model")
    eos_id, pad_id = check_tokenizer(profile, tokenizer)
    return view, tokenizer, eos_id, pad_id


def choose_sft_budget(
    out_json,
    work,
    revision: str = "r002",
    profile_name: str = "embedded",
    budgets: list[str] | None = None,
    previous=None,
    say=print,
) -> dict:
    """Measure every candidate budget on validation prompts; write the record to `out_json`
    (never overwritten) and return it. Every argument is checked before anything is written."""
    out_json, work = Path(out_json), output_folder(work)
    if out_json.exists():
        raise FileExistsError(f"{out_json} exists: the budget was already chosen (use a new --out)")
    profile = load_profile(profile_name)
    if profile.model.kind != "embedded":
        raise StudyError(f"the SFT budget is chosen on the embedded lab, not profile {profile.name}")
    names = check_budgets(budgets)
    measured = previous_candidates(previous, revision, profile)
    configure_torch(profile)
    view, tokenizer, eos_id, pad_id = prepare_work(work, revision, profile)
    t0 = time.perf_counter()
    command = (
        f"rlhf choose-sft-budget --out {out_json} --work {work} --revision {revision}"
        + (f" --budgets {','.join(budgets)}" if budgets else "")
        + "".join(f" --previous {p}" for p in previous or [])
    )
    for name in names:
        if any(m["budget"] == name for m in measured):
            continue
        p = override(profile, budget_changes(profile, name))
        m = {
            "budget": name,
            "epochs": p.sft.epochs,
            **measure_budget(view, work / "base_model", p, tokenizer, eos_id, pad_id),
            "measured_by": command,
            "code": code_sha256(),
        }
        say(
            f"{name}: {m['updates']} updates, greedy validation rubric success "
            f"{m['validation']['rubric_success']:.3f} ({m['train_seconds']:.0f} s)"
        )
        measured.append(m)
    measured.sort(key=lambda m: EPOCH_BUDGETS[m["budget"]])
    record = {
        "revision": revision,
        "profile": profile.name,
        "profile_sha256": profile_hash(profile),
        **ran_with(),
        "seeds": dataclasses.asdict(profile.seeds),
        "rule": RULE,
        "inputs": "the learning view only: train demonstrations and validation pairs "
        "(prompts; actions read from the chosen answers); no test prompt",
        "candidates": measured,
        "chosen": choose(measured, candidate_budgets()),
        "command": command,
        "not_measured": [b for b in candidate_budgets() if all(m["budget"] != b for m in measured)],
        "seconds": time.perf_counter() - t0,
    }
    write_json(out_json, record)
    return record
