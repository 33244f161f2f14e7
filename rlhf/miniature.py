"""The miniature path of a profile: every stage at tiny budgets (the full-width test, `rlhf lab --dry-run`).

`miniature_profile(profile)` is the profile with only its budgets cut (and, for a cut-down
model directory, its layer count): the same widths, vocabulary, tokenizer, dtype, LoRA, token
limits, seeds, learning rates and PPO constants. It serves

* the full-width unit test (tests_unit/test_qwen_full_width.py): Qwen2.5-0.5B's widths with 2
  of its 24 layers and random weights, through every stage on the CPU;
* `rlhf lab --dry-run` (`dry_run`): the same path on the user's own model directory (or the
  embedded base) in a throw-away folder, and the projected time of every stage of `rlhf lab`
  from the measured legs (rlhf.projection).

What a miniature run cuts (MINIATURE_BUDGET), each key a budget:

    sft/judge   2 epochs of 2 updates (the protocol's boundary is epoch 1; three updates after
                each leg's first give the projection its median), validation cut to its first
                batch of 16 examples/pairs, expected_updates 4
    ppo         3 iterations, stopped after 1 for the interrupt/resume protocol, a checkpoint
                every iteration, rollouts cut to 8 new tokens (a cut row is truncated like a
                row at 64: the truncation penalty path runs). At full width on 2 shared cores
                one 64-token rollout of 4 rows took 41 s (the 151,936-row BF16 vocabulary
                projection is read from memory at every step), so an uncut PPO leg alone
                was minutes
    evaluation  held-out answers cut to 2 new tokens, and every held-out set to its first 2
                units (evaluation.max_units): 2 test families (10 test prompts, 10 test pairs, 10
                shortcut-audit pairs per counterfactual set) and 2 probe contexts (8 rows, 8
                candidates). At full width the whole held-out evaluation and shortcut audit took
                60 s of the dry run's 107 s on 2 cores; cut, each part is projected back to its
                full count (rlhf.projection)

A CPU run of a CUDA profile is never silent: the miniature of a CUDA profile runs on CUDA when
torch sees one, else on the CPU with `device = "cpu"` written into the profile (and so into
run.json and its config hash), by the caller's explicit choice (`cpu=True`).
"""

from __future__ import annotations

import tempfile
import time
from functools import partial
from pathlib import Path

from rlhf import lab, projection
from rlhf.config import Profile, override
from rlhf.io import read_json, write_json
from rlhf.legs import SIDE_BY_SIDE, default_legs
from rlhf.models import precision_line
from rlhf.roles import load_role
from rlhf.tokens import encode_prompt

# SFT and the judge get the same cut: 2 epochs of 2 updates, validation cut to one batch of 16.
EPOCH_STAGE_CUT = {"epochs": 2, "max_updates_per_epoch": 2, "expected_updates": 4, "max_validation_examples": 16}
MINIATURE_BUDGET = {
    **{(stage, key): value for stage in ("sft", "judge") for key, value in EPOCH_STAGE_CUT.items()},
    ("ppo", "iterations"): 3,
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


# ------------------------------------------------------------------------- the dry run


def dry_run(
    profile: Profile,
    model_dir=None,
    *,
    out=None,
    layers: int | None = None,
    cpu: bool = False,
    random_weights: bool = False,
    say=None,
) -> dict:
    """Measure, project, then rehearse: the miniature of `profile` on `model_dir` (None: the
    embedded base, built) in `out` (default: a new temporary folder, kept for inspection), in two
    run folders:

        measure/    the whole lab once at the miniature's budgets (every stage, no protocol,
                    each leg clocked), then the decode and scoring steps measured on its
                    trained roles; from them the projection of every stage of `rlhf lab`
                    (rlhf.projection), printed and written to projection.json (and
                    dry_run.json) before the rehearsal
        rehearsal/  the whole lab with the interrupt/resume protocol (rlhf.lab.run_lab), its
                    continuous legs taken over from measure/ (rlhf.lab.adopt_continuous_leg:
                    identity-checked, not computed twice), and so the evaluation of the same
                    final PPO state (rlhf.lab.adopt_evaluation: its hash checked); then the
                    shortcut audit and the reports: every stage ran, the protocol held

    Returns dry_run.json's record."""
    say = say or _say
    mini = miniature_profile(profile, layers=layers, cpu=cpu, random_weights=random_weights)
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="rlhf-dry-run-"))
    t = time.perf_counter()
    ctx = lab.open_context(root / "measure", mini, model_dir=model_dir)
    say(
        f"dry run of {profile.name} on {ctx.device}: the whole lab once at the miniature budgets (each "
        f"stage's measurement printed as it comes), the projection, then the lab rehearsed with its protocol"
    )
    say(precision_line(ctx.precision))
    lab.run_stages(ctx, protocol=False, done=lambda stage: _say_measured(ctx.run, stage, say))
    lab.run_lab(ctx, protocol=False)  # the report
    wall_s = time.perf_counter() - t  # the lab's own seconds: the step measurements below are not the lab's
    measured = projection.measured_miniature(
        ctx.run, mini, measure_decode_steps(ctx), measure_scoring_steps(ctx), wall_s
    )
    steps_s = time.perf_counter() - t - wall_s
    record = {
        "profile": profile.name,
        "miniature": mini.name,
        "device": ctx.device,
        "model_dir": str(ctx.model_dir),
        "run": str(root),
        "measured_s": time.perf_counter() - t,
        "step_measurements_s": steps_s,  # the decode and scoring steps' timing (not projected)
        "measured": measured,
        "projection": projection.project_lab(measured, profile, side_by_side=default_legs() == SIDE_BY_SIDE),
        "arithmetic": read_json(ctx.run / lab.RUN_FILE)["arithmetic"]["note"],
        "precision": ctx.precision,
    }
    write_json(root / "projection.json", record["projection"], overwrite=True)  # a rerun after a crash measures again
    write_json(root / "dry_run.json", record, overwrite=True)
    for line in dry_run_lines(record):
        say(line)
    record["rehearsal"] = rehearse(root, mini, ctx.model_dir, say)
    record["wall_s"] = time.perf_counter() - t
    write_json(root / "dry_run.json", record, overwrite=True)
    say(
        f"dry run finished in {record['wall_s']:.1f} s: every stage ran, the interrupt/resume protocol held; "
        f"everything is in {root} (a throw-away folder; projection.json and dry_run.json hold these numbers)"
    )
    return record


def rehearse(root: Path, mini: Profile, model_dir: Path, say) -> dict[str, bool]:
    """The whole lab with its protocol in root/rehearsal, around measure/'s continuous legs and
    evaluation; returns {stage: interrupt/resume identical}."""
    say("rehearsing the whole lab with the interrupt/resume protocol (the projection above is final)")
    ctx = lab.open_context(root / "rehearsal", mini, model_dir=model_dir)
    for stage in projection.TRAINING:
        lab.adopt_continuous_leg(ctx, root / "measure", stage)
    lab.run_stages(ctx, protocol=True, until="ppo")
    if lab.adopt_evaluation(ctx, root / "measure"):  # the same final PPO state (checked): the same numbers
        say("evaluation: taken over from measure/ (the same final PPO state, by its SHA-256)")
    lab.run_lab(ctx, protocol=True)
    return {stage: read_json(ctx.run / stage / "resume_check.json")["identical"] for stage in projection.TRAINING}


def _timing_prompts(ctx: lab.Context) -> list[list[int]]:
    """The first 32 rollout prompts, encoded: the step measurements need prompts of the lab's
    lengths, not test prompts."""
    records = ctx.corpus.learning_view().rollout_prompts()[: projection.EVALUATION_BATCH]
    return [encode_prompt(ctx.tokenizer, r["prompt"], ctx.profile.limits) for r in records]


def measure_decode_steps(ctx: lab.Context) -> dict[str, float]:
    """Seconds of one decode step of the miniature's SFT actor (rlhf.projection.decode_step_seconds)
    as PPO draws (its prompts per iteration, sampling) and as the evaluation does (a batch of 32,
    greedy), on rollout prompts: timing needs prompts of the right length, not test prompts."""
    actor = ctx.role("actor")
    load_role(actor, ctx.run / "sft" / "actor.safetensors")
    prompts = _timing_prompts(ctx)
    step = partial(
        projection.decode_step_seconds,
        actor.model,
        pad_id=ctx.pad_id,
        last_logits_only=ctx.profile.runtime.last_logits_only,
    )
    return {
        "ppo": step(prompts[: ctx.profile.ppo.prompts_per_iteration], greedy=False),
        "evaluation": step(prompts, greedy=True),
    }


def measure_scoring_steps(ctx: lab.Context) -> dict[str, float]:
    """Seconds one more answer token adds to the teacher-forced passes (rlhf.projection.
    scoring_step_seconds), on rollout prompts with the miniature's own trained roles: the
    evaluation's scoring of a batch of 32 (judge, actor, reference), and a PPO iteration's passes
    over its rollout (`ppo_passes`)."""
    from rlhf.evaluate import evaluation_roles, score_batch
    from rlhf.lab.stages import ppo_roles

    prompts = _timing_prompts(ctx)
    step = partial(projection.scoring_step_seconds, pad_id=ctx.pad_id, token_id=ctx.eos_id)

    def evaluation() -> float:  # each measurement's roles are freed before the next one's load
        roles = evaluation_roles(ctx)
        device = next(roles.ppo.model.parameters()).device
        return step(
            lambda batch: score_batch(batch, roles.ppo.model, roles.reference.model, roles.judge),
            prompts,
            device=device,
        )

    def ppo() -> float:
        roles = ppo_roles(ctx)
        device = next(roles.actor.model.parameters()).device
        updates, rows = ctx.profile.ppo.updates_per_iteration, ctx.profile.ppo.prompts_per_iteration
        return step(lambda batch: ppo_passes(roles, batch, updates), prompts[:rows], device=device)

    return {"evaluation": evaluation(), "ppo": ppo()}


def ppo_passes(roles, batch, updates: int) -> None:
    """A PPO iteration's passes over a rollout of `batch` (rlhf.ppo.rollout, rlhf.ppo.ppo_update)
    without its optimizer steps: reference log-probs, the judges' scores and the critic's values,
    then per update the actor's log-probs and the critic's values with their backward passes.
    The gradients are dropped; no weight moves."""
    import torch

    from rlhf.roles import critic_values, reward_scores
    from rlhf.scoring import response_logprobs

    with torch.no_grad():
        response_logprobs(roles.reference.model, batch)
        for judge in (roles.judge, *roles.members):
            reward_scores(judge, batch)
        critic_values(roles.critic, batch)
    for _ in range(updates):
        response_logprobs(roles.actor.model, batch).sum().backward()
        critic_values(roles.critic, batch).sum().backward()
    for role in (roles.actor, roles.critic):
        for p in role.learned_parameters():
            p.grad = None


def _say_measured(run: Path, stage: str, say) -> None:
    if stage in projection.TRAINING:
        legs = read_json(run / stage / "timings.json")["legs"]["continuous"]
        fit = projection.fit_leg(legs["clock"], legs["seconds"])
        unit = "iteration" if stage == "ppo" else "update"
        per_unit, fixed = fit["per_unit"], fit["fixed"]
        say(f"  measured {stage}: {per_unit:.3f} s per {unit} after the first, {fixed:.1f} s fixed per leg")


def _say(line: str) -> None:
    print(line, flush=True)  # progress: shown as it is measured, also when the output is a pipe


def dry_run_lines(record: dict) -> list[str]:
    """What `rlhf lab --dry-run` prints: the measurement, then each stage's projection."""
    p, m = record["projection"], record["measured"]
    lines = [
        f"measured {record['miniature']} on {record['device']} in {record['measured_s']:.1f} s; "
        f"arithmetic: {record['arithmetic']}",
        precision_line(record["precision"]),
        f"decode step: {m['decode_step']['ppo'] * 1e3:.2f} ms (PPO's batch, sampling), "
        f"{m['decode_step']['evaluation'] * 1e3:.2f} ms (the evaluation's batch of 32, greedy); "
        f"scoring step: {m['scoring_step']['evaluation'] * 1e3:.2f} ms (one answer token more, the evaluation's batch "
        f"of 32), {m['scoring_step']['ppo'] * 1e3:.2f} ms (PPO's rollout: its passes and backward passes)",
        f"projected time of `rlhf lab` with the {record['profile']} profile on this machine "
        f"(fixed + units x per unit, per leg; every answer at the 64-token limit):",
    ]
    for stage, s in p["stages"].items():
        detail = ""
        if "legs" in s:
            units = " + ".join(str(leg["units"]) for leg in s["legs"])
            detail = f"  ({units} {'iterations' if stage == 'ppo' else 'updates'} at {s['per_unit_s']:.3f} s)"
        lines.append(f"  {stage:<15} {s['projected_s']:10.1f} s{detail}")
    lines.append(
        f"  the lab with its interrupt/resume protocol, legs {p['legs']}: {p['lab_s']:.1f} s "
        f"({p['lab_s'] / 60:.1f} min)"
    )
    return lines
