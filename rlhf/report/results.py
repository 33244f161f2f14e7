"""Collecting the results of a finished run folder: the content of ``results.json``.

``collect_results(run_dir)`` reads the run folder (layout: the docstring of ``rlhf.lab``; the
evaluation stage adds ``evaluation/results.json``). The corpus manifest and the three histories
(``REQUIRED_INPUTS``) are required; a missing evaluation is recorded as "not run".
"""

from __future__ import annotations

from pathlib import Path

from rlhf import designs
from rlhf.io import read_json, sha256_file
from rlhf.report import wording
from rlhf.report.formatting import mean
from rlhf.report.labels import STAGES

REQUIRED_INPUTS = ("corpus/manifest.json", "sft/history.json", "judge/history.json", "ppo/history.json")


def _read_optional(path: Path):
    return read_json(path) if path.is_file() else None


def _curves(records: list[dict]) -> dict:
    keys = sorted({k for r in records for k in r})
    return {k: [r.get(k) for r in records] for k in keys}


def _epoch_summary(h: dict) -> dict:
    """What the SFT and judge summaries share: update and epoch counts, the first and last
    update's loss, the peak learning rate, and the last epoch's train and validation loss."""
    ups, ep = h.get("updates", []), h.get("epochs", [])
    last = ep[-1] if ep else {}
    return {
        "updates": len(ups),
        "total_updates": h.get("total_updates"),
        "epochs": len(ep),
        "first_update_loss": ups[0]["loss"] if ups else None,
        "last_update_loss": ups[-1]["loss"] if ups else None,
        "peak_lr": max((u.get("lr", 0) for u in ups), default=None),
        "final_train_loss": last.get("train_loss"),
        "final_validation_loss": last.get("validation_loss"),
    }


def _sft_summary(h: dict) -> dict:
    ups = h.get("updates", [])
    return {
        **_epoch_summary(h),
        "mean_loss_last_10_updates": mean([u.get("loss") for u in ups[-10:]]),
        "response_tokens_trained": sum(u.get("tokens", 0) for u in ups),
        "max_grad_norm_before_clipping": max((u.get("grad_norm", 0) for u in ups), default=None),
    }


def _judge_summary(h: dict) -> dict:
    ups, ep = h.get("updates", []), h.get("epochs", [])
    last = ep[-1] if ep else {}
    return {
        **_epoch_summary(h),
        "mean_accuracy_last_10_updates": mean([u.get("accuracy") for u in ups[-10:]]),
        "final_train_accuracy": last.get("train_accuracy"),
        "final_validation_accuracy": last.get("validation_accuracy"),
        "final_validation_ties": last.get("validation_ties"),
    }


def _ppo_summary(h: dict) -> dict:
    its = h.get("iterations", [])
    consumed = h.get("consumed", [])
    first, last = its[:10], its[-10:]
    return {
        "iterations": len(its),
        "sampled_responses": len(consumed),
        "distinct_rollout_prompts": len(set(consumed)),
        "actor_updates": sum(len(i.get("policy_loss", [])) for i in its),
        "critic_updates": sum(len(i.get("value_loss", [])) for i in its),
        "truncations": sum(i.get("truncations", 0) for i in its),
        "mean_score_first_10": mean([i.get("mean_score") for i in first]),
        "mean_score_last_10": mean([i.get("mean_score") for i in last]),
        "mean_sampled_log_ratio_first_10": mean([i.get("mean_sampled_log_ratio") for i in first]),
        "mean_sampled_log_ratio_last_10": mean([i.get("mean_sampled_log_ratio") for i in last]),
        "mean_response_length_first_10": mean([i.get("response_length") for i in first]),
        "mean_response_length_last_10": mean([i.get("response_length") for i in last]),
        "value_loss_last_10": mean([v for i in last for v in i.get("value_loss", [])]),
        "clip_fraction_mean": mean([v for i in its for v in i.get("clip_fraction", [])]),
    }


def _reward_design(h: dict) -> dict:
    """The reward design PPO ran with (its history names any but the default) and, for the
    iterated judge, every refresh's record (rlhf.refresh)."""
    its = h.get("iterations", [])
    design = its[0].get("reward_design", designs.DEFAULT) if its else designs.DEFAULT
    out = {"design": design, "what": designs.label(design)}
    if "refreshes" in h:
        out["refreshes"] = h["refreshes"]
    if its and "member_scores" in its[0]:
        out["ensemble_size"] = len(its[0]["member_scores"])
    return out


def _fingerprint_checks(fp: dict | None, judge_learns: bool = False) -> dict | None:
    """Per role: the actor and critic must change, every other role stay frozen, except the
    iterated judge's judge, which may change (refreshed during PPO)."""
    if not fp or "before" not in fp or "after" not in fp:
        return None
    out = {}
    for role in sorted(set(fp["before"]) & set(fp["after"])):
        b, a = fp["before"][role], fp["after"][role]
        changed = b.get("learned_sha256") != a.get("learned_sha256")
        must_change: bool | None = None if (judge_learns and role == "judge") else role in ("actor", "critic")
        base_kept = b.get("frozen_sha256") == a.get("frozen_sha256")
        out[role] = {
            "learned_changed": changed,
            "must_change": must_change,
            "frozen_base_unchanged": base_kept,
            "ok": (must_change is None or changed == must_change) and base_kept,
        }
    return out


def _evaluation(run: Path) -> dict:
    path = run / "evaluation" / "results.json"
    if not path.is_file():
        return {
            "status": "not run",
            "note": (
                "Evaluation not run: evaluation/results.json is absent in this run folder, so the "
                "SFT-vs-PPO comparison, the judge test accuracy, the politeness probes and the actor "
                "probe outputs are not shown. Run the evaluation stage on this run, then write the "
                "reports again (reports are never overwritten: move the old report files away first)."
            ),
        }
    data = read_json(path)
    return {"status": "run", "file": "evaluation/results.json", "sha256": sha256_file(path), **data}


def _resume_checks(run: Path) -> dict:
    resume = {s: _read_optional(run / s / "resume_check.json") for s in STAGES}
    for s, rc in resume.items():
        if rc:
            rc["file_sha256_resumed_equals_continuous"] = rc.get("sha256_resumed") == rc.get("sha256_continuous")
    return {s: resume[s] for s in STAGES if resume[s]}


def _artifacts(run: Path) -> dict:
    artifacts = {}
    for rel in ("sft/actor.safetensors", "judge/judge.safetensors", "ppo/actor.safetensors", "ppo/critic.safetensors"):
        side = _read_optional(run / (rel + ".json"))
        if side:
            artifacts[rel] = {
                "sha256": side.get("sha256"),
                "role": side.get("role"),
                "base_frozen_sha256": side.get("base_frozen_sha256"),
                "tensors": len(side.get("tensors", {})),
            }
    return artifacts


def _timings(run: Path, evaluation: dict) -> dict:
    timings = {s: _read_optional(run / s / "timings.json") for s in STAGES}
    ppo_timing = timings.get("ppo") or {}
    return {
        "stages": {
            s: {k: v for k, v in (timings[s] or {}).items() if k not in ("per_iteration", "total")}
            for s in STAGES
            if timings[s]
        },
        "ppo_phase_totals_s": ppo_timing.get("total"),
        "ppo_per_iteration_s": ppo_timing.get("per_iteration"),
        "memory": ppo_timing.get("memory"),
        "evaluation_s": evaluation.get("seconds") if evaluation["status"] == "run" else None,
    }


def _judge_test(evaluation: dict) -> dict:
    rt = evaluation.get("judge_test") if evaluation["status"] == "run" else None
    # Without the 180 per-pair scores (evaluation/results.json keeps them).
    return (
        {k: v for k, v in rt.items() if k != "rows"}
        if isinstance(rt, dict)
        else {"status": "not run", "accuracy": None, "by_variant": {}}
    )


def collect_results(run_dir) -> dict:
    """Everything the reports show, as one JSON-ready dict (the content of results.json)."""
    run = Path(run_dir)
    missing = [p for p in REQUIRED_INPUTS if not (run / p).is_file()]
    if missing:
        raise FileNotFoundError(
            f"run folder {run} is not finished: missing {', '.join(missing)} (run the lab stages first)"
        )
    manifest = read_json(run / "corpus/manifest.json")
    sft_h = read_json(run / "sft/history.json")
    judge_h = read_json(run / "judge/history.json")
    ppo_h = read_json(run / "ppo/history.json")
    fingerprints = _read_optional(run / "ppo/fingerprints.json")
    base = _read_optional(run / "base_model/manifest.json")
    evaluation = _evaluation(run)
    design = _reward_design(ppo_h)
    return {
        "schema": "rlhf.report/1",
        "run_dir": str(run.resolve()),
        "score_name": wording.SCORE_NAME,
        "honesty": list(wording.HONESTY),
        "corpus": {
            "audit": manifest.get("audit", {}),
            "files_sha256": manifest.get("files", {}),
            "probe_families": manifest.get("probe_families", []),
            "manifest_sha256": sha256_file(run / "corpus/manifest.json"),
        },
        "base_model": (
            {k: base.get(k) for k in ("kind", "parameters", "shape", "eos_token_id", "pad_token_id", "seed", "files")}
            if base
            else None
        ),
        "sft": {
            "summary": _sft_summary(sft_h),
            "epochs": sft_h.get("epochs", []),
            "curves": _curves(sft_h.get("updates", [])),
        },
        "judge": {
            "summary": _judge_summary(judge_h),
            "epochs": judge_h.get("epochs", []),
            "curves": _curves(judge_h.get("updates", [])),
        },
        "reward_design": design,
        # The over-optimisation warnings that fired (lab.fired_warnings); None for a run that predates the record.
        "warnings": _read_optional(run / "ppo/warnings.json"),
        "ppo": {
            "summary": _ppo_summary(ppo_h),
            "curves": _curves(ppo_h.get("iterations", [])),
            "scoring_check": ppo_h.get("scoring_check"),
            "token_views": ppo_h.get("token_views", []),
            "consumed_rollout_ids": ppo_h.get("consumed", []),
        },
        "timings": _timings(run, evaluation),
        "resume_checks": _resume_checks(run),
        "fingerprints": fingerprints,
        "fingerprint_checks": _fingerprint_checks(
            fingerprints, judge_learns=designs.design(design["design"]).refreshes_judge
        ),
        "artifacts": _artifacts(run),
        "evaluation": evaluation,
        "judge_test": _judge_test(evaluation),
        "shortcut_audit": _read_optional(run / "shortcut_audit" / "results.json"),
        # What the run is and the CPU arithmetic it ran (rlhf.runtime): pinned hashes compare across machines.
        "run": _read_optional(run / "run.json"),
    }
