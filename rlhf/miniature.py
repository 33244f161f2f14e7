"""The miniature path of a profile: every stage at tiny budgets (the full-width test, `rlhf lab --dry-run`).

`miniature_profile(profile)` is the profile with only its budgets cut (and, for a cut-down
model directory, its layer count): the same widths, vocabulary, tokenizer, dtype, LoRA, token
limits, seeds, learning rates and PPO constants. It serves

* the full-width unit test (tests_unit/test_qwen_full_width.py): Qwen2.5-0.5B's widths with 2
  of its 24 layers and random weights, through every stage on the CPU;
* `rlhf lab --dry-run` (`dry_run`): the same path on the user's own model directory in a
  throw-away folder, and the projected time of each full stage from the measured step times.

What a miniature run cuts (MINIATURE_BUDGET), each key a budget:

    sft/judge   2 epochs of 1 update (the protocol's boundary is epoch 1), validation cut to
                the first 4 examples/pairs, expected_updates 2
    ppo         2 iterations, stopped after 1 for the interrupt/resume protocol, a checkpoint
                every iteration, rollouts cut to 8 new tokens (a cut row is truncated like a
                row at 64: the truncation penalty path runs). At full width on 2 shared cores
                one 64-token rollout of 4 rows took 41 s (the 151,936-row BF16 vocabulary
                projection is read from memory at every step), so an uncut PPO leg alone
                was minutes
    evaluation  held-out answers cut to 2 new tokens, and every held-out set to its first 2
                units (evaluation.max_units): 2 test families (10 test prompts, 10 test pairs, 10
                shortcut-audit pairs per counterfactual set) and 2 probe contexts (8 rows, 8
                candidates). At full width the whole held-out evaluation and shortcut audit took
                60 s of the dry run's 107 s on 2 cores; cut, each scored part is projected back
                to its full count (`project`)

A CPU run of a CUDA profile is never silent: the miniature of a CUDA profile runs on CUDA when
torch sees one, else on the CPU with `device = "cpu"` written into the profile (and so into
run.json and its config hash), by the caller's explicit choice (`cpu=True`).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rlhf import lab
from rlhf.config import Profile, override
from rlhf.evaluate import EXPECTED_ROWS
from rlhf.io import read_json, write_json
from rlhf.models import precision_line
from rlhf.tokens import max_new_tokens

# SFT and the judge get the same cut: 2 epochs of 1 update, validation cut to 4.
EPOCH_STAGE_CUT = {"epochs": 2, "max_updates_per_epoch": 1, "expected_updates": 2, "max_validation_examples": 4}
MINIATURE_BUDGET = {
    **{(stage, key): value for stage in ("sft", "judge") for key, value in EPOCH_STAGE_CUT.items()},
    ("ppo", "iterations"): 2,
    ("ppo", "resume_stop_iteration"): 1,
    ("ppo", "checkpoint_every"): 1,
    ("ppo", "max_new_tokens"): 8,
    ("evaluation", "max_new_tokens"): 2,
    ("evaluation", "max_units"): 2,
}
# What follows from the layer count: 7 adapted projections per layer, and their parameters.
LAYER_KEYS = (("model", "num_hidden_layers"), ("lora", "expected_adapters"), ("lora", "expected_parameters"))
# What says that this is not the real run: its name, and the device when a CUDA profile is run
# on the CPU on purpose; random weights are accepted only when asked for.
LABEL_KEYS = (("name",), ("device",), ("model", "allow_random_weights"))


def miniature_profile(
    profile: Profile, *, layers: int | None = None, cpu: bool = False, random_weights: bool = False
) -> Profile:
    """`profile` with MINIATURE_BUDGET written in (rlhf.config.override, checked like a file);
    `layers` cuts the layer count (and the LoRA counts that follow from it); `cpu` runs a CUDA
    profile on the CPU on purpose."""
    changes: dict = dict(MINIATURE_BUDGET)
    if layers is not None:
        full = profile.model.num_hidden_layers
        if not 1 <= layers <= full:
            raise ValueError(f"a miniature keeps 1 to {full} layers, not {layers}")
        changes[("model", "num_hidden_layers")] = layers
        lora = profile.lora
        for key, value in (
            ("expected_adapters", lora.expected_adapters),
            ("expected_parameters", lora.expected_parameters),
        ):
            if value % full:
                raise ValueError(f"lora.{key} = {value} is not a multiple of {full} layers")
            changes[("lora", key)] = value // full * layers
    changes[(None, "name")] = f"{profile.name}-miniature"
    if cpu:
        changes[(None, "device")] = "cpu"
    if random_weights:
        changes[("model", "allow_random_weights")] = True
    return override(profile, changes)


def flat(profile, prefix: tuple = ()) -> dict[tuple, object]:
    """{(table, key): value} of every leaf of a profile (a Profile or its to_dict())."""
    data = profile.to_dict() if isinstance(profile, Profile) else profile
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(flat(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def differing_keys(a: Profile, b: Profile) -> set[tuple]:
    """The leaf keys whose value differs (or that exist in one profile only)."""
    fa, fb = flat(a), flat(b)
    return {k for k in set(fa) | set(fb) if fa.get(k, None) != fb.get(k, None) or (k in fa) != (k in fb)}


# ------------------------------------------------------------------------- the dry run


def stage_units(profile: Profile) -> dict[str, int]:
    """Updates (SFT, judge) or iterations (PPO) of one leg of each stage under `profile`, and the
    new tokens of each held-out answer (evaluation)."""

    return {
        "sft": profile.sft.expected_updates,
        "judge": profile.judge.expected_updates,
        "ppo": profile.ppo.iterations,
        "ppo_rollout_tokens": max_new_tokens(profile, "ppo"),
        "evaluation": max_new_tokens(profile, "evaluation"),
    }


STAGE_FOLDERS = {"sft": "sft", "judge": "judge", "ppo": "ppo"}
UNIT_NAMES = {"sft": "update", "judge": "update", "ppo": "iteration"}
# What each timed part of the evaluation (rlhf.evaluate.stage_evaluate's "seconds", without the
# policy prefix) grows with, and that count in the full evaluation. Loading the roles, the
# bootstrap and the politeness exercise do not grow with a cut: the exercise is mostly its
# before/after hashing of the judge and every artifact (1.3 s for 8 candidates, 2.7 s for 80 at
# full width on 2 cores).
EVALUATION_GROWTH = {"scoring": "rows", "rubric": "rows", "judge_test_accuracy": "pairs"}
FULL_EVALUATION = {
    "rows": EXPECTED_ROWS["test"] + EXPECTED_ROWS["probe"],  # 260 per policy
    "pairs": EXPECTED_ROWS["test"],  # one test pair per test prompt: 180
}


def evaluation_counts(results: dict) -> dict[str, int]:
    """Rows per policy and test pairs that an evaluation's results.json covers."""
    return {"rows": len(results["policies"]["sft"]["rows"]), "pairs": results["judge_test"]["pairs"]}


def measured_step_seconds(run: Path, mini: Profile) -> dict[str, dict]:
    """Seconds per update (SFT, judge) / iteration (PPO) of the miniature's continuous leg, from
    its resume_check.json (`continuous_s`, the leg run from scratch to the end, role building
    and the cut validation included), and the evaluation's greedy generation seconds per new
    token, grown to the full 260 rows per policy, with the rest of the evaluation grown part by
    part to its full count (EVALUATION_GROWTH; it does not depend on the answer length)."""
    units = stage_units(mini)
    out = {}
    for stage, folder in STAGE_FOLDERS.items():
        seconds = read_json(run / folder / "resume_check.json")["continuous_s"]
        out[stage] = {"seconds": seconds, "units": units[stage], "per_unit": seconds / units[stage]}
    # PPO: the rollouts' generation part, per new token (the miniature cuts rollouts short).
    ppo_timings = read_json(run / "ppo" / "timings.json")["per_iteration"]
    continuous = ppo_timings[-units["ppo"] :]  # the legs append in order; the continuous leg is last
    out["ppo"]["rollout_tokens"] = units["ppo_rollout_tokens"]
    out["ppo"]["generation_per_token"] = (
        sum(t["generation"] for t in continuous) / units["ppo"] / units["ppo_rollout_tokens"]
    )
    results = read_json(run / "evaluation" / "results.json")
    ev, counts = results["seconds"], evaluation_counts(results)
    generation = sum(v for k, v in ev.items() if k.endswith("_generation"))
    rest_full = ev["total"] - generation
    for name, seconds in ev.items():
        growth = EVALUATION_GROWTH.get(name.removeprefix("sft_").removeprefix("ppo_"))
        if growth is not None:
            rest_full += seconds * (FULL_EVALUATION[growth] / counts[growth] - 1)
    out["evaluation"] = {
        "seconds": ev["total"],
        "generation_seconds": generation,
        "units": units["evaluation"],
        "counts": counts,
        "per_unit": generation / units["evaluation"] * FULL_EVALUATION["rows"] / counts["rows"],
        "rest_seconds": ev["total"] - generation,
        "rest_seconds_full": rest_full,
    }
    return out


def project(step: dict[str, dict], full: Profile) -> dict[str, dict]:
    """Projected seconds of each full stage (one leg, no interrupt/resume repeat):

        stage seconds = measured seconds per update/iteration x the full profile's count
        PPO iteration = measured seconds per iteration + measured rollout generation seconds
                        per new token x (64 - the miniature's rollout tokens); scoring and
                        updates as measured on the shorter responses (an underestimate)
        evaluation    = measured generation seconds per new token (grown to the full 260 rows
                        per policy) x 64 (the full answer length) + the rest of the evaluation,
                        each part grown to its full count of rows or test pairs
                        (EVALUATION_GROWTH; rest_seconds_full)

    The lab's interrupt/resume protocol runs each training stage twice over (boundary + resumed
    leg, then the continuous leg): `lab_with_protocol` is 2 x the three stages + evaluation.
    """
    units = stage_units(full)
    out = {
        stage: {
            "per_unit_s": step[stage]["per_unit"],
            "units": units[stage],
            "projected_s": step[stage]["per_unit"] * units[stage],
        }
        for stage in STAGE_FOLDERS
    }
    # PPO rollouts of the full length: the generation part grows with the new tokens.
    ppo = step["ppo"]
    extra_tokens = units["ppo_rollout_tokens"] - ppo.get("rollout_tokens", units["ppo_rollout_tokens"])
    out["ppo"]["per_unit_s"] = ppo["per_unit"] + ppo["generation_per_token"] * extra_tokens
    out["ppo"]["projected_s"] = out["ppo"]["per_unit_s"] * units["ppo"]
    ev = step["evaluation"]
    out["evaluation"] = {
        "per_unit_s": ev["per_unit"],
        "units": units["evaluation"],
        "projected_s": ev["per_unit"] * units["evaluation"] + ev["rest_seconds_full"],
    }
    training = sum(out[s]["projected_s"] for s in STAGE_FOLDERS)
    out["one_leg_total_s"] = training + out["evaluation"]["projected_s"]
    out["lab_with_protocol_s"] = 2 * training + out["evaluation"]["projected_s"]
    return out


def dry_run(
    profile: Profile,
    model_dir,
    *,
    out=None,
    layers: int | None = None,
    cpu: bool = False,
    random_weights: bool = False,
    say=None,
) -> dict:
    """Measure, project, then rehearse: the miniature of `profile` on `model_dir` in `out`
    (default: a new temporary folder, kept for inspection), in two run folders:

        measure/    each training stage once (its continuous leg) and the held-out evaluation;
                    from their step times the projection of every full stage (`project`) is
                    printed and written to dry_run.json as soon as they are measured
        rehearsal/  the whole lab with the interrupt/resume protocol (rlhf.lab.run_lab), its
                    continuous legs taken over from measure/ (rlhf.lab.adopt_continuous_leg:
                    identity-checked, not computed twice), and so the evaluation of the same
                    final PPO state (rlhf.lab.adopt_evaluation: its hash checked); then the
                    shortcut audit and the reports: every stage ran, the protocol held

    Returns dry_run.json's record."""

    if say is None:
        say = _say
    mini = miniature_profile(profile, layers=layers, cpu=cpu, random_weights=random_weights)
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="rlhf-dry-run-"))
    measure, rehearsal = root / "measure", root / "rehearsal"
    t = time.perf_counter()
    ctx = lab.open_context(measure, mini, model_dir=model_dir)
    say(
        f"dry run of {profile.name} on {ctx.device}: measuring each stage once at the miniature budgets "
        f"(every stage of the projection is printed as it is measured), then rehearsing the whole lab"
    )
    say(precision_line(ctx.precision))
    full_units = stage_units(profile)

    def measured(stage: str) -> None:
        if stage not in STAGE_FOLDERS:
            return
        seconds = read_json(measure / stage / "resume_check.json")["continuous_s"]
        per_unit = seconds / stage_units(mini)[stage]
        say(
            f"  measured {stage}: {per_unit:.2f} s per {UNIT_NAMES[stage]} "
            f"(x {full_units[stage]} in the full run: {per_unit * full_units[stage] / 3600:.2f} h"
            + (", before the rollouts' cut tokens are added)" if stage == "ppo" else ")")
        )

    lab.run_stages(ctx, protocol=False, until="evaluate", done=measured)
    step = measured_step_seconds(measure, mini)
    record = {
        "profile": profile.name,
        "miniature": mini.name,
        "device": ctx.device,
        "model_dir": str(model_dir),
        "run": str(root),
        "measured_s": time.perf_counter() - t,
        "measured": step,
        "projection": project(step, profile),
        "arithmetic": read_json(measure / lab.RUN_FILE)["arithmetic"]["note"],
        "precision": ctx.precision,
        "formula": "projected stage seconds = measured seconds per update/iteration (one continuous run) "
        "x the full profile's updates/iterations; a PPO iteration adds the rollout's "
        "generation seconds per token x the tokens the miniature cut; evaluation = "
        "generation seconds per new token (grown to 260 rows per policy) x full answer length + the rest, "
        "each part grown to its full count of rows or test pairs",
    }
    write_json(root / "dry_run.json", record, overwrite=True)  # a rerun after a crash measures nothing again
    for line in dry_run_lines(record):
        say(line)
    say("rehearsing the whole lab with the interrupt/resume protocol (the projection above is final)")
    ctx = lab.open_context(rehearsal, mini, model_dir=model_dir)
    for stage in STAGE_FOLDERS:
        lab.adopt_continuous_leg(ctx, measure, stage)
    lab.run_stages(ctx, protocol=True, until="ppo")
    if lab.adopt_evaluation(ctx, measure):  # the same final PPO state (checked): the same numbers
        say("evaluation: taken over from measure/ (the same final PPO state, by its SHA-256)")
    lab.run_lab(ctx, protocol=True)
    record["wall_s"] = time.perf_counter() - t
    record["rehearsal"] = {
        stage: read_json(rehearsal / stage / "resume_check.json")["identical"] for stage in STAGE_FOLDERS
    }
    write_json(root / "dry_run.json", record, overwrite=True)
    say(
        f"dry run finished in {record['wall_s']:.1f} s: every stage ran, the interrupt/resume protocol held; "
        f"everything is in {root} (a throw-away folder; dry_run.json holds these numbers)"
    )
    return record


def _say(line: str) -> None:
    print(line, flush=True)  # progress: shown as it is measured, also when the output is a pipe


def dry_run_lines(record: dict) -> list[str]:
    """What `rlhf lab --dry-run` prints."""
    p = record["projection"]
    names = {
        "sft": "SFT updates",
        "judge": "judge updates",
        "ppo": "PPO iterations",
        "evaluation": "evaluation new tokens per answer",
    }
    lines = [
        f"measured {record['miniature']} on {record['device']} in {record['measured_s']:.1f} s; "
        f"arithmetic: {record['arithmetic']}",
        precision_line(record["precision"]),
        f"projected time of the full {record['profile']} run on this machine ({record['formula']}):",
    ]
    for stage in ("sft", "judge", "ppo", "evaluation"):
        s = p[stage]
        lines.append(
            f"  {stage:<10} {s['per_unit_s']:9.2f} s x {s['units']:>3} {names[stage]:<33} = "
            f"{s['projected_s'] / 3600:8.2f} h"
        )
    lines.append(
        f"  one leg of each stage + evaluation: {p['one_leg_total_s'] / 3600:.2f} h; the lab with its "
        f"interrupt/resume protocol (training stages twice): {p['lab_with_protocol_s'] / 3600:.2f} h"
    )
    return lines
