"""The base study: can the embedded base carry an SFT actor and a judge that reads the situation?

The study measures a base through the project's own code, with the budgets the profile fixed
before any measurement (one training run each, validation picks nothing):

* on r001: SFT (the profile's budget, `lab.train_role`), then on the 180 held-out test prompts
  the share with the correct action when greedy, and the share of in-grammar responses that end
  with EOS when sampled at temperature 1 from a generator seeded with `seeds.evaluation`;
* on r002 (no give-aways): the judge (the profile's budget), its accuracy on the 180 test pairs,
  on variants 1, 2 and 4 together (the 108 pairs whose preferred action depends on reading the
  situation), and the shortcut audit's conflict accuracy (1d: the situation sentence swapped so
  that the preferred answer flips; rlhf.shortcut).

It runs on two bases of one size and one (zero-step) training budget, built by
`rlhf.embedded.build_embedded` from the same weight seed:

* "embedded", the lab's base (its files must equal rlhf/embedded_expected.json);
* "control", whose tokenizer is learned on text where each situation is followed by a fix drawn
  independently of it. The embedded base's weights are random, so the only text-dependent part
  is the tokenizer; the control says whether that text matters.

`rlhf base-study --out DIR` writes DIR/results.json (never overwritten) and keeps every run
folder (corpus, actor, judge, shortcut audit) under DIR/<base>/r001 and DIR/<base>/r002.

`--reuse RUN` (a finished `rlhf lab` run folder, r001 or r002) takes the embedded base's SFT (r001)
or judge (r002) from that run instead of training it again, when the run trained it from exactly
what the study would (profile, corpus, base model, code, CPU arithmetic, initial weights: the
lab's identity of the stage, checked): the same bytes, so the same measurements.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rlhf import rubric
from rlhf.checkpoint import load_state
from rlhf.config import EpochStage, Profile, load_profile, profile_hash
from rlhf.embedded import EXPECTED_BUILD, build_embedded
from rlhf.evaluate import expected_actions, heldout_prompts, judge_test_accuracy, policy_responses
from rlhf.identities import describe_change
from rlhf.io import output_folder, read_json, write_json
from rlhf.judge import train_judge
from rlhf.lab import initial_fingerprints, open_context, train_role
from rlhf.roles import save_role
from rlhf.sft import train_sft
from rlhf.shortcut import run_shortcut_audit
from rlhf.tokens import decode_response, encode_prompt

STUDY = "base_study"
VERSION = 1
BASES = {"embedded": "office", "control": "control"}  # base name -> build text
CONFLICT_VARIANTS = ("1", "2", "4")
# The bounds, fixed before measuring, for the chosen base (the control is measured, not judged).
CRITERIA = {
    "sft_greedy_correct_action": 0.90,
    "sft_temperature_1_in_grammar": 0.80,
    "judge_r002_test_accuracy": 0.90,
    "judge_r002_variants_1_2_4": 0.85,
}


class BaseStudyError(ValueError):
    """The study's inputs are not what it claims to measure."""


def _share(flags) -> float:
    flags = list(flags)
    return sum(bool(f) for f in flags) / len(flags)


def _test_rows(ctx, responses: list[list[int]], records: list[dict]) -> list[dict]:
    """Rubric verdicts of responses to the test prompts (labels read only here, after generation)."""
    expected = expected_actions(ctx.corpus.evaluation_view())
    rows = []
    for rec, ids in zip(records, responses):
        text, finish = decode_response(ctx.tokenizer, ids, ctx.eos_id)
        verdict = rubric.evaluate(text, finish, expected[rec["document_id"]])
        rows.append(
            {
                "document_id": rec["document_id"],
                "response": text,
                "finish_reason": finish,
                "expected_action": expected[rec["document_id"]],
                **verdict,
            }
        )
    return rows


def _summary(rows: list[dict]) -> dict:
    return {
        "n": len(rows),
        "correct_action": _share(r["action"] == r["expected_action"] for r in rows),
        "in_grammar": _share(r["recognized"] and r["finish_reason"] == "eos" for r in rows),
        "rubric_success": _share(r["rubric_success"] for r in rows),
        "examples": [r["response"] for r in rows[:3]],
    }


def trained_in_lab(ctx, lab_run, stage: str, kind: str) -> dict | None:
    """The final `stage` state of the finished lab run `lab_run` (None: no run given), refused
    unless its identity is the one this study's context would give that stage."""
    if lab_run is None:
        return None
    path = Path(lab_run) / stage / "state-continuous.pt.gz"
    want = ctx.identity(stage=stage, initial=initial_fingerprints({kind: ctx.role(kind)}))
    if not path.is_file():
        raise BaseStudyError(f"{lab_run} has no finished {stage} stage ({path})")
    change = describe_change(read_json(f"{path}.json")["identity"], want)
    if change:
        raise BaseStudyError(f"{path} was not trained from what this study trains from: {change}")
    return load_state(path, want)


def measure_sft(ctx, lab_run=None) -> dict:
    """r001: SFT with the profile's budget (or its state from `lab_run`, trained_in_lab); greedy and
    temperature-1 answers to the 180 test prompts."""

    t0 = time.perf_counter()
    state = trained_in_lab(ctx, lab_run, "sft", "actor") or train_role(ctx, "actor", train_sft)
    actor = ctx.role("actor")
    actor.load_learned_state(state["actor"])
    actor.model.eval()
    save_role(actor, ctx.run / "sft" / "actor.safetensors", ctx.identity(stage="base_study_sft"))
    train_seconds = time.perf_counter() - t0

    records = [r for r in heldout_prompts(ctx.corpus.evaluation_view()) if r["population"] == "test"]
    limits = ctx.profile.limits
    prompt_ids = [encode_prompt(ctx.tokenizer, r["prompt"], limits, r["document_id"]) for r in records]
    seed = ctx.profile.seeds.evaluation
    greedy = _test_rows(ctx, policy_responses(actor.model, prompt_ids, ctx), records)
    sampled = _test_rows(
        ctx, policy_responses(actor.model, prompt_ids, ctx, generator=torch.Generator().manual_seed(seed)), records
    )
    last = state["history"]["epochs"][-1]
    return {
        "revision": ctx.corpus.revision,
        "trained_in": str(lab_run) if lab_run is not None else "this study",
        "updates": state["step"],
        "last_epoch": {"train_loss": last["train_loss"], "validation_loss": last["validation_loss"]},
        "greedy": _summary(greedy),
        "temperature_1": {**_summary(sampled), "temperature": ctx.profile.ppo.temperature, "generator_seed": seed},
        "train_seconds": train_seconds,
        "seconds": time.perf_counter() - t0,
    }


def measure_judge(ctx, lab_run=None) -> dict:
    """r002: the judge with the profile's budget (or its state from `lab_run`, trained_in_lab);
    test accuracy, variants 1/2/4, the conflict audit."""

    if ctx.corpus.revision != "r002":
        raise BaseStudyError(f"the judge is measured on r002 (no give-aways), not {ctx.corpus.revision}")
    t0 = time.perf_counter()
    state = trained_in_lab(ctx, lab_run, "judge", "judge") or train_role(ctx, "judge", train_judge)
    judge = ctx.role("judge")
    judge.load_learned_state(state["judge"])
    judge.freeze()
    save_role(judge, ctx.run / "judge" / "judge.safetensors", ctx.identity(stage="base_study_judge"))
    train_seconds = time.perf_counter() - t0
    test = judge_test_accuracy(judge, ctx)
    audit = run_shortcut_audit(ctx)  # reloads the saved judge, hash-checked, writes shortcut_audit/
    conflict = audit["counterfactuals"]["d_conflict"]
    # Variants hold equal numbers of pairs (36 each), so the pooled share is the mean of shares;
    # checked against the pair count rather than assumed.
    labels = ctx.corpus.evaluation_view().labels("pair", "test")
    counts = {v: sum(str(lab["variant"]) == v for lab in labels) for v in CONFLICT_VARIANTS}
    pooled = sum(test["by_variant"][v] * counts[v] for v in CONFLICT_VARIANTS) / sum(counts.values())
    last = state["history"]["epochs"][-1]
    return {
        "revision": ctx.corpus.revision,
        "trained_in": str(lab_run) if lab_run is not None else "this study",
        "updates": state["step"],
        "last_epoch": {k: last[k] for k in ("train_loss", "validation_loss", "validation_accuracy")},
        "test_accuracy": test["accuracy"],
        "by_variant": test["by_variant"],
        "ties": test["ties"],
        "pairs": test["pairs"],
        "variants_1_2_4": pooled,
        "variants_1_2_4_pairs": sum(counts.values()),
        "conflict": {
            "accuracy": conflict["accuracy"],
            "by_variant": conflict["by_variant"],
            "pairs": conflict["pairs"],
        },
        "shortcut_audit": {k: v["accuracy"] for k, v in audit["counterfactuals"].items()},
        "train_seconds": train_seconds,
        "seconds": time.perf_counter() - t0,
    }


def verdict(measures: dict) -> dict:
    """Each criterion of CRITERIA: the measured value, the bound, and whether it holds."""
    values = {
        "sft_greedy_correct_action": measures["sft"]["greedy"]["correct_action"],
        "sft_temperature_1_in_grammar": measures["sft"]["temperature_1"]["in_grammar"],
        "judge_r002_test_accuracy": measures["judge"]["test_accuracy"],
        "judge_r002_variants_1_2_4": measures["judge"]["variants_1_2_4"],
    }
    return {k: {"value": values[k], "at_least": bound, "holds": values[k] >= bound} for k, bound in CRITERIA.items()}


def build_base(out: Path, name: str) -> tuple[Path, dict]:
    """Build base `name` into out/bases/name; the embedded one must equal the committed build."""
    model_dir = out / "bases" / name
    manifest = build_embedded(model_dir, text=BASES[name])
    if name == "embedded":
        expected = read_json(EXPECTED_BUILD)["files"]
        if manifest["files"] != expected:
            raise BaseStudyError("the rebuilt embedded base differs from rlhf/embedded_expected.json")
    return model_dir, manifest


def _budget(stage: EpochStage) -> dict:
    """The training budget fixed before measuring (results keys as written)."""
    return {"epochs": stage.epochs, "lr": stage.lr, "expected_updates": stage.expected_updates}


def measure_base(out: Path, name: str, profile: Profile, reuse: dict | None = None) -> dict:
    """Both measurements on base `name`; `reuse` ({revision: lab run folder}) for the embedded base."""
    model_dir, manifest = build_base(out, name)
    reuse = reuse or {}
    sft = measure_sft(
        open_context(out / name / "r001", profile, model_dir=model_dir, revision="r001"), reuse.get("r001")
    )
    judge = measure_judge(
        open_context(out / name / "r002", profile, model_dir=model_dir, revision="r002"), reuse.get("r002")
    )
    return {
        "build": {
            "text": manifest["text"],
            "seed": manifest["seed"],
            "parameters": manifest["parameters"],
            "files": manifest["files"],
            "seconds": manifest["build_seconds"],
            "pretraining_steps": 0,
        },
        "sft": sft,
        "judge": judge,
    }


def reuse_by_revision(runs) -> dict:
    """{revision: run folder} of finished lab runs (their revision read from run.json); one per revision."""
    out: dict = {}
    for run in runs or []:
        record = Path(run) / "run.json"
        if not record.is_file():
            raise BaseStudyError(f"{run} is not a lab run folder (no run.json)")
        revision = read_json(record)["identity"]["revision"]
        if revision in out:
            raise BaseStudyError(f"two runs of revision {revision} given: {out[revision]} and {run}")
        out[revision] = Path(run)
    return out


def run_base_study(out, profile_name: str = "embedded", bases=tuple(BASES), reuse=None) -> dict:
    """Measure every base in `bases`, in that order; write out/results.json (refused if it
    exists). `reuse`: lab run folders whose SFT (r001) or judge (r002) stands for the embedded
    base's (trained_in_lab), or a callable returning them, called when the embedded base is
    measured (the test suite measures the control first while its labs are being built)."""
    out = output_folder(out)
    if (out / "results.json").exists():
        raise FileExistsError(f"{out / 'results.json'} exists: the base study already ran (use a new --out)")
    profile = load_profile(profile_name)
    if profile.model.kind != "embedded":
        raise BaseStudyError(f"the base study measures embedded bases, not profile {profile.name}")
    t0 = time.perf_counter()
    measured = {}
    for name in bases:
        runs = (reuse() if callable(reuse) else reuse) if name == "embedded" else None
        measured[name] = measure_base(out, name, profile, reuse_by_revision(runs))
    result = {
        "study": STUDY,
        "version": VERSION,
        "profile": profile.name,
        "profile_sha256": profile_hash(profile),
        "budgets": {
            "sft": _budget(profile.sft),
            "judge": _budget(profile.judge),
            "fixed_before_measuring": True,
        },
        "chosen": "embedded",
        "criteria": CRITERIA,
        "bases": measured,
        "verdict": {name: verdict(m) for name, m in measured.items()},
        "seconds": time.perf_counter() - t0,
    }
    write_json(out / "results.json", result)
    return result


def summary_lines(result: dict) -> list[str]:
    """The table `rlhf base-study` prints."""
    head = ("base", "SFT greedy correct", "SFT T=1 in-grammar", "judge r002 test", "variants 1/2/4", "conflict (1d)")
    lines = ["  ".join(f"{h:>18}" for h in head)]
    for name, m in result["bases"].items():
        cells = (
            name,
            m["sft"]["greedy"]["correct_action"],
            m["sft"]["temperature_1"]["in_grammar"],
            m["judge"]["test_accuracy"],
            m["judge"]["variants_1_2_4"],
            m["judge"]["conflict"]["accuracy"],
        )
        lines.append("  ".join(f"{c:>18}" if isinstance(c, str) else f"{c:>18.3f}" for c in cells))
    return lines
