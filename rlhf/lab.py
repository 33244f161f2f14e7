"""The lab's stages over one run folder, each runnable alone (`rlhf sft|reward|ppo --run DIR`)
or all in order (`rlhf lab --out DIR`).

Run folder:

    corpus/                 inputs/, labels/, manifest.json (rlhf.corpus)
    base_model/             the embedded base, built here unless --model-dir is given
    sft/    state-*.pt.gz   resume states (+ .json sidecars with SHA-256 and identity)
            actor.safetensors(+.json)   final SFT adapters
            history.json, timings.json, resume_check.json
    reward/ the same for the judge (judge.safetensors)
    ppo/    the same for PPO (actor.safetensors, critic.safetensors, fingerprints.json)

Interrupt/resume protocol (SPEC §7), run by the lab and by tests_reproducibility:
stop after a boundary (SFT epoch 1, judge epoch 1, PPO iteration 40), resume from that state
to the end, run the same stage continuously to the end, and require the two final states to
be identical tensor by tensor. Nothing existing is overwritten.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from rlhf.checkpoint import (StateError, assert_states_equal, identity_of, load_state, save_state, seed_system_rngs,
                             sha256_file)
from rlhf.config import configure_torch, load_profile, profile_hash
from rlhf.io import read_json, write_json
from rlhf.models import directory_identity, load_tokenizer, check_tokenizer
from rlhf.roles import (ROLE_KINDS, assert_role_isolation, fingerprint, load_role, new_role, save_role)


class Context:
    """What every stage needs: profile, run folder, corpus, base model directory, tokenizer."""

    def __init__(self, run, profile: dict, model_dir, corpus):
        self.run = Path(run)
        self.profile = profile
        self.model_dir = Path(model_dir)
        self.corpus = corpus
        self.base_identity = {"files": directory_identity(self.model_dir)}
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_id, self.pad_id = check_tokenizer(profile, self.tokenizer)
        self.device = "cuda" if profile.get("device") == "cuda" and torch.cuda.is_available() else "cpu"
        configure_torch(profile)

    def identity(self, **extra) -> dict:
        return identity_of(profile_hash(self.profile), sha256_file(self.corpus.root / "manifest.json"),
                           self.base_identity, {"revision": self.corpus.revision, **extra})

    def role(self, kind: str):
        return new_role(kind, self.profile, self.model_dir, base_identity=self.base_identity, device=self.device)


def open_context(run, profile_name: str | dict = "embedded", model_dir=None, revision: str = "r001") -> Context:
    """Prepare (first time) or load (hash-verified) the run's corpus and base; refuse mixing.

    `profile_name` is a profile name or an already loaded profile dict (tests use small budgets).
    """
    from rlhf.corpus import load_corpus, prepare
    from rlhf.embedded import build_embedded
    run = Path(run)
    profile = profile_name if isinstance(profile_name, dict) else load_profile(profile_name)
    corpus_dir = run / "corpus"
    if not (corpus_dir / "manifest.json").is_file():
        prepare(corpus_dir, revision=revision)
    corpus = load_corpus(corpus_dir)
    if corpus.revision != revision:
        raise ValueError(f"run {run} holds corpus revision {corpus.revision}, not {revision}: "
                         f"one run never mixes revisions; use a new --out folder")
    if model_dir is None:
        if profile["model"]["kind"] != "embedded":
            raise ValueError(f"profile {profile['name']} needs --model-dir DIR "
                             f"(get the weights with: rlhf fetch-model --out DIR)")
        model_dir = run / "base_model"
        if not (model_dir / "config.json").is_file():
            build_embedded(model_dir)
    return Context(run, profile, model_dir, corpus)


def _progress(desc: str, total: int):
    from tqdm import tqdm
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
               disable=not sys.stderr.isatty())
    def update(step, _total, loss):
        bar.n = step
        bar.set_postfix_str(f"loss {loss:.4f}" if isinstance(loss, float) else "")
        bar.refresh()
    return bar, update


def _say(line: str) -> None:
    print(line, flush=True)


# ------------------------------------------------------------------------- a resumable stage

def run_protocol(ctx: Context, stage: str, boundary: int, run_fn, identity: dict, *, resume: bool = False,
                 stop_after: int | None = None) -> dict:
    """Run `stage` with the interrupt/resume protocol, or just one part of it.

    run_fn(state, stop_after) -> (state, timings) runs from `state` (None: fresh) up to
    `stop_after` (None: the end). Files in ctx.run/stage:
      state-boundary   the interrupted run, saved at the boundary
      state-resumed    resumed from state-boundary to the end
      state-continuous the same stage run from scratch to the end, without interruption
    `stop_after` alone (stage command with --stop-after): write the boundary state and return.
    `resume` alone (stage command with --resume): continue from the boundary state.
    """
    folder = ctx.run / stage
    folder.mkdir(parents=True, exist_ok=True)
    paths = {k: folder / f"state-{k}.pt.gz" for k in ("boundary", "resumed", "continuous")}
    timings = {}
    if stop_after is not None:
        t = time.perf_counter()
        state, tm = run_fn(None, stop_after)
        save_state(folder / f"state-stop{stop_after:03d}.pt.gz", state, identity)
        return {"state": state, "timings": tm, "seconds": time.perf_counter() - t}
    if resume:
        stops = sorted(folder.glob("state-stop*.pt.gz"))
        if not stops:
            raise StateError(f"nothing to resume in {folder}: no state-stopNNN.pt.gz")
        t = time.perf_counter()
        state, tm = run_fn(load_state(stops[-1], identity), None)
        save_state(paths["resumed"], state, identity)
        return {"state": state, "timings": tm, "seconds": time.perf_counter() - t}
    for k, p in paths.items():
        if p.exists():
            raise FileExistsError(f"{p} exists: stage {stage} already ran in {ctx.run} (use a new --out folder)")
    t = time.perf_counter()
    _say(f"{stage}: interrupted run, stopping after {boundary}")
    state_b, tm_b = run_fn(None, boundary)
    save_state(paths["boundary"], state_b, identity)
    _say(f"{stage}: resumed from the saved state after {boundary}, to the end")
    state_r, tm_r = run_fn(load_state(paths["boundary"], identity), None)
    save_state(paths["resumed"], state_r, identity)
    timings["interrupted_and_resumed_s"] = time.perf_counter() - t
    t = time.perf_counter()
    _say(f"{stage}: continuous run from scratch (compared with the resumed one)")
    state_c, tm_c = run_fn(None, None)
    save_state(paths["continuous"], state_c, identity)
    timings["continuous_s"] = time.perf_counter() - t
    compared = assert_states_equal(state_c, state_r, stage)
    check = {"stage": stage, "boundary": boundary, "identical": True, "tensors_compared": compared,
             "sha256_continuous": read_json(str(paths["continuous"]) + ".json")["sha256"],
             "sha256_resumed": read_json(str(paths["resumed"]) + ".json")["sha256"],
             "sha256_boundary": read_json(str(paths["boundary"]) + ".json")["sha256"], **timings}
    write_json(folder / "resume_check.json", check)
    return {"state": state_c, "timings": tm_c, "check": check, "seconds": timings["continuous_s"]}


# ------------------------------------------------------------------------- stages

def train_role(ctx: Context, kind: str, train_fn, *, state=None, stop=None, progress=None) -> dict:
    """A fresh `kind` role trained by `train_fn` (train_sft or train_judge) on the learning view,
    from the profile's torch seed; returns the training state (what a stage saves and resumes)."""
    role = ctx.role(kind)
    seed_system_rngs(ctx.profile["seeds"]["torch"])
    return train_fn(role, ctx.corpus.learning_view(), ctx.tokenizer, ctx.eos_id, ctx.pad_id, ctx.profile,
                    state=state, stop_after_epoch=stop, progress=progress)


def _epoch_stage(ctx: Context, stage: str, kind: str, key: str, train_fn, epoch_line, artifact: str,
                 resume: bool, stop_after) -> dict:
    """SFT and the judge: the same resumable epoch stage over a different role and loss."""
    # SPEC §10: the identity includes the initial fingerprints (learned and frozen) of the role.
    identity = ctx.identity(stage=stage, initial=_initial_fingerprints({kind: ctx.role(kind)}))
    bar, tick = _progress(stage, 1)

    def run_fn(state, stop):
        def progress(step, total, loss):
            bar.total = total
            tick(step, total, loss)
        return train_role(ctx, kind, train_fn, state=state, stop=stop, progress=progress), {}

    result = run_protocol(ctx, stage, 1, run_fn, identity, resume=resume, stop_after=stop_after)
    bar.close()
    history = result["state"]["history"]
    for e in history["epochs"]:
        _say(epoch_line(e))
    if stop_after is None:
        role = ctx.role(kind)
        role.load_learned_state(result["state"][key])
        if kind == "reward":
            role.freeze()  # the judge is frozen from here on
        save_role(role, ctx.run / stage / artifact, identity)
        write_json(ctx.run / stage / "history.json", history)
        write_json(ctx.run / stage / "timings.json", {"seconds": result["seconds"], **result.get("check", {})})
    return result


def stage_sft(ctx: Context, *, resume=False, stop_after=None) -> dict:
    from rlhf.sft import train_sft
    return _epoch_stage(ctx, "sft", "actor", "actor", train_sft,
                        lambda e: (f"sft epoch {e['epoch'] + 1}: train loss {e['train_loss']:.4f}  "
                                   f"validation loss {e['validation_loss']:.4f}"),
                        "actor.safetensors", resume, stop_after)


def stage_reward(ctx: Context, *, resume=False, stop_after=None) -> dict:
    from rlhf.judge import train_judge
    return _epoch_stage(ctx, "reward", "reward", "judge", train_judge,
                        lambda e: (f"judge epoch {e['epoch'] + 1}: train loss {e['train_loss']:.4f}  validation "
                                   f"loss {e['validation_loss']:.4f}  validation accuracy "
                                   f"{e['validation_accuracy']:.3f}"),
                        "judge.safetensors", resume, stop_after)


def ppo_roles(ctx: Context) -> dict:
    """Actor, reference and critic from the SFT adapters; the judge from its trained state."""
    roles = {k: ctx.role(k) for k in ROLE_KINDS}
    sft_file = ctx.run / "sft" / "actor.safetensors"
    load_role(roles["actor"], sft_file)
    load_role(roles["reference"], sft_file, source_kind="actor")
    load_role(roles["critic"], sft_file, source_kind="actor", adapters_only=True)
    load_role(roles["reward"], ctx.run / "reward" / "judge.safetensors")
    roles["reward"].freeze()
    roles["reference"].freeze()
    return roles


def stage_ppo(ctx: Context, *, resume=False, stop_after=None, use_cache=True) -> dict:
    from rlhf.ppo import train_ppo
    view = ctx.corpus.learning_view()
    identity = ctx.identity(stage="ppo", sft=sha256_file(ctx.run / "sft" / "actor.safetensors"),
                            judge=sha256_file(ctx.run / "reward" / "judge.safetensors"),
                            initial=_initial_fingerprints(ppo_roles(ctx)))
    cfg = ctx.profile["ppo"]
    bar, tick = _progress("PPO", cfg["iterations"])
    fingerprints = {}

    def run_fn(state, stop):
        roles = ppo_roles(ctx)
        assert_role_isolation(roles)
        before = {k: fingerprint(r) for k, r in roles.items()}
        seed_system_rngs(ctx.profile["seeds"]["torch"])

        def progress(it, total, rec):
            tick(it, total, rec["policy_loss"][-1])
            line = (f"ppo iteration {it}: judge score {rec['mean_score']:+.3f}  sampled log-ratio "
                    f"{rec['mean_sampled_log_ratio']:+.4f}  value loss {rec['value_loss'][-1]:.4f}  "
                    f"clip fraction {rec['clip_fraction'][-1]:.3f}  length {rec['response_length']:.1f}  "
                    f"truncations {rec['truncations']}")
            if sys.stderr.isatty():
                bar.write(line)
            elif it % 10 == 0 or it == total:
                _say(line)
        out, tm = train_ppo(roles, view, ctx.tokenizer, ctx.eos_id, ctx.pad_id, ctx.profile, state=state,
                            stop_after_iteration=stop, use_cache=use_cache, progress=progress)
        assert_role_isolation(roles)
        after = {k: fingerprint(r) for k, r in roles.items()}
        check_fingerprints(before, after, moved=out["iterations_done"] > (state or {}).get("iterations_done", 0))
        fingerprints["before"], fingerprints["after"] = _short(before), _short(after)
        return out, tm

    result = run_protocol(ctx, "ppo", ctx.profile["ppo"]["resume_stop_iteration"], run_fn, identity,
                          resume=resume, stop_after=stop_after)
    bar.close()
    if stop_after is None:
        roles = ppo_roles(ctx)
        roles["actor"].load_learned_state(result["state"]["actor"])
        roles["critic"].load_learned_state(result["state"]["critic"])
        save_role(roles["actor"], ctx.run / "ppo" / "actor.safetensors", identity)
        save_role(roles["critic"], ctx.run / "ppo" / "critic.safetensors", identity)
        write_json(ctx.run / "ppo" / "history.json", result["state"]["history"])
        write_json(ctx.run / "ppo" / "timings.json", {"seconds": result["seconds"], **result["timings"],
                                                      **result.get("check", {})})
        write_json(ctx.run / "ppo" / "fingerprints.json", fingerprints)
    return result


def _initial_fingerprints(roles: dict) -> dict:
    """{role: [learned_sha256, frozen_sha256]} of freshly built roles (part of a stage's identity)."""
    return {k: [fp["learned_sha256"], fp["frozen_sha256"]] for k, fp in
            ((k, fingerprint(r)) for k, r in roles.items())}


def _short(fps: dict) -> dict:
    return {k: {"learned_sha256": v["learned_sha256"], "frozen_sha256": v["frozen_sha256"]} for k, v in fps.items()}


def check_fingerprints(before: dict, after: dict, moved: bool = True) -> None:
    """Reference and judge unchanged; every base unchanged; actor and critic changed."""
    for kind in ROLE_KINDS:
        if before[kind]["frozen_sha256"] != after[kind]["frozen_sha256"]:
            raise AssertionError(f"the frozen base of role {kind} changed during PPO")
    for kind in ("reference", "reward"):
        if before[kind]["learned_sha256"] != after[kind]["learned_sha256"]:
            raise AssertionError(f"role {kind} changed during PPO; it must stay frozen")
    if moved:
        for kind in ("actor", "critic"):
            if before[kind]["learned_sha256"] == after[kind]["learned_sha256"]:
                raise AssertionError(f"role {kind} did not change during PPO")
