"""The run folder: what a run is (its Context: profile, corpus, base model, tokenizer), how it
is opened (prepared the first time, hash-checked after; a foreign or damaged folder refused
before anything is written) and its record run.json (the identity a rerun must match, and the
stages complete)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from rlhf import events, identities, runtime, signals
from rlhf.checkpoint import StateError
from rlhf.config import PROFILES, Profile, load_profile, profile_hash
from rlhf.corpus import load_corpus, prepare
from rlhf.embedded import build_embedded
from rlhf.io import output_folder, read_json, sha256_file, sweep_incomplete, write_json
from rlhf.legs import SEQUENTIAL
from rlhf.models import check_tokenizer, compute_dtype, directory_identity, load_tokenizer
from rlhf.roles import new_role
from rlhf.runtime import configure_determinism, configure_torch, rng_state, set_rng_state
from rlhf.tokens import Tokens


class Context:
    """What every stage needs: profile, run folder, corpus, base model directory, tokenizer.
    `trained_in`: the run folder whose sft/ and judge/ PPO starts from (default: this one; a
    frontier arm runs PPO in its own folder from its seed's SFT and judge)."""

    def __init__(self, run, profile: Profile, model_dir, corpus, trained_in=None):
        self.run = Path(run)
        self.trained_in = self.run if trained_in is None else Path(trained_in)
        self.profile = profile
        self.legs = SEQUENTIAL  # the protocol's legs one after the other, or side by side (rlhf.legs)
        self.device = profile_device(profile)
        self.model_dir = Path(model_dir)
        self.corpus = corpus
        self.base_identity = {"files": directory_identity(self.model_dir)}
        self.tokenizer = load_tokenizer(self.model_dir)
        self.eos_id, self.pad_id = check_tokenizer(profile, self.tokenizer)
        # Ids at or past the tokenizer's size are embedding padding: never sampled or scored
        # (rlhf.scoring.real_token_logits). Part of every identity.
        self.real_tokens = len(self.tokenizer)
        # The dtype the base computes in here and why (BF16 weights on a CPU without native BF16
        # compute in float32): part of every identity, so states of two dtypes never mix.
        self.precision = compute_dtype(profile)
        configure_torch(profile)
        # Before any role exists: cuBLAS reads its workspace setting when its handle is created.
        self.determinism = configure_determinism(profile)

    def tokens(self, use_cache: bool = True) -> Tokens:
        """The tokenizer and its EOS and PAD ids as PPO samples and scores with them."""
        return Tokens(self.tokenizer, self.eos_id, self.pad_id, use_cache)

    def identity(self, **extra) -> dict:
        return identities.identity_of(
            profile_hash(self.profile),
            sha256_file(self.corpus.root / "manifest.json"),
            self.base_identity,
            {
                "revision": self.corpus.revision,
                "dtype": self.precision["dtype"],
                "real_tokens": self.real_tokens,
                **extra,
            },
        )

    def role(self, kind: str):
        return new_role(
            kind,
            self.profile,
            self.model_dir,
            base_identity=self.base_identity,
            tokenizer=self.tokenizer,
            device=self.device,
        )


def profile_device(profile: Profile) -> str:
    """The profile's device, never a silent fallback: a CUDA profile on a machine without CUDA is
    an error (a qwen2.5-0.5b run on the CPU would take days, and its numbers would not be the
    GPU run's). To run a CUDA profile's code path on the CPU on purpose, use a copy of the
    profile with `device = "cpu"`."""
    device = profile.device
    if device not in ("cpu", "cuda"):
        raise ValueError(f"profile {profile.name}: device must be 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"profile {profile.name} runs on CUDA, and torch sees no CUDA device here "
            f"(torch {torch.__version__}); no silent fallback to the CPU. For the CPU on purpose, "
            f'use a copy of the profile with device = "cpu"'
        )
    return device


def open_context(run, profile_name: str | Profile = "embedded", model_dir=None, revision: str = "r001") -> Context:
    """Prepare (first time) or load (hash-verified) the run's corpus and base; refuse mixing.

    `profile_name` is a profile name, a TOML path, or an already loaded Profile (tests pass
    small budgets made with `config.override`).
    """
    run = output_folder(run)
    profile = profile_name if isinstance(profile_name, Profile) else load_profile(profile_name)
    profile_device(profile)  # refused before anything is prepared
    stop_rules_identity(profile)  # a stop signal without a frozen rule: refused before SFT, not at PPO
    refuse_old_layout(run)
    refuse_foreign_folder(run)
    if (run / RUN_FILE).is_file():
        read_json(run / RUN_FILE)  # a damaged run.json is refused, naming it, before anything is written
    events.check_writable(run)  # refused before anything is written
    _sweep_run_folder(run)
    corpus_dir = run / "corpus"
    if not (corpus_dir / "manifest.json").is_file():
        prepare(corpus_dir, revision=revision)
    corpus = _run_corpus(run, revision)
    if model_dir is None:
        if profile.model.kind != "embedded":
            raise ValueError(
                f"profile {profile.name} needs --model-dir DIR (get the weights with: rlhf fetch-model --out DIR)"
            )
        model_dir = run / "base_model"
        if not (model_dir / "config.json").is_file():
            build_embedded(model_dir)
    # Context applies the profile's threads and seed to this process; a refused run puts back
    # the caller's (a library caller continues after the refusal).
    threads, rngs = torch.get_num_threads(), rng_state()
    try:
        ctx = Context(run, profile, model_dir, corpus)
        check_run_record(ctx)
    except Exception:
        torch.set_num_threads(threads)
        set_rng_state(rngs)
        raise
    return ctx


def read_context(run, profile: Profile, revision: str, *, model_dir=None, trained_in=None) -> Context:
    """A run's context, to read it (a finished run) or to run one leg beside the process that
    opened it (rlhf.legs): its corpus and base model hash-checked as they load, nothing
    prepared, built, swept or written, and run.json not compared (so that a later code version
    can still read the run's files)."""
    run = Path(run)
    model_dir = run / "base_model" if model_dir is None else model_dir
    return Context(run, profile, model_dir, _run_corpus(run, revision), trained_in=trained_in)


def _run_corpus(run: Path, revision: str):
    """The run's corpus (hash-checked), refused when it is not of `revision`."""
    corpus = load_corpus(run / "corpus")
    if corpus.revision != revision:
        raise ValueError(
            f"run {run} holds corpus revision {corpus.revision}, not {revision}: "
            f"one run never mixes revisions; use a new --out folder"
        )
    return corpus


RUN_FILE = "run.json"


def refuse_old_layout(run: Path) -> None:
    """The one compatibility rule for run folders written before the judge had one name: their
    judge stage lives in `reward/`. Such a folder is refused with the reason,
    before anything is read or written; its states were made by older code, which the run's
    code identity would refuse anyway, so it is never continued or mixed with new stages."""
    if (run / "reward").is_dir() and not (run / "judge").exists():
        raise StateError(
            f"run folder {run} has the old layout (its judge stage is in reward/; the stage "
            f"is now judge/) and was written by an older rlhf: it cannot be continued. "
            f"Its results stay readable as files; start afresh in a new folder: "
            f"rlhf lab --out NEW_FOLDER"
        )


# What a run folder may hold before its corpus: a study's run profile (rlhf.studies.derivation
# writes seed-i/profile.toml first), the run's own event folder (checked by events.check_writable)
# and what a crash left while preparing (swept below).
BEFORE_CORPUS = ("profile.toml", "tensorboard")  # and logs (*.log): a study logs a seed's lab into its folder


def refuse_foreign_folder(run: Path) -> None:
    """Refuse a non-empty folder that is not a run: the lab writes its corpus first, so a folder
    with neither run.json nor corpus/ holding anything but BEFORE_CORPUS, logs and hidden leftovers
    of an interrupted write belongs to something else, and the run's files would be mixed into it."""
    if not run.is_dir() or (run / RUN_FILE).is_file() or (run / "corpus").is_dir():
        return
    foreign = sorted(
        p.name
        for p in run.iterdir()
        if p.name not in BEFORE_CORPUS and not p.name.startswith(".") and not (p.suffix == ".log" and p.is_file())
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(
            f"folder {run} is not empty and is not a run (no {RUN_FILE}, no corpus/; it holds {shown}): "
            f"a run is written into a folder of its own; give a new or empty folder"
        )


def _sweep_run_folder(run: Path) -> None:
    """Remove what a crash left at the top of a run folder: temporary files and the temporary
    folders of an interrupted corpus preparation or base build (`.corpus.*`, `.base_model.*`)."""
    if not run.is_dir():
        return
    sweep_incomplete(run, sidecar_patterns=())
    for p in list(run.glob(".corpus.*")) + list(run.glob(".base_model.*")):
        if p.is_dir():
            shutil.rmtree(p)


def run_identity(ctx: Context) -> dict:
    """What a run is: a rerun in the same folder must match every part."""
    return identities.run_identity(
        ctx.profile.name,
        profile_hash(ctx.profile),
        ctx.corpus.revision,
        sha256_file(ctx.corpus.root / "manifest.json"),
        ctx.base_identity["files"],
        ctx.precision["dtype"],
        ctx.real_tokens,
    )


def check_run_record(ctx: Context) -> dict:
    """Write run.json on first use; afterwards refuse a context whose identity differs."""
    path = ctx.run / RUN_FILE
    current = run_identity(ctx)
    if not path.is_file():
        record = {
            "format": "rlhf-run-1",
            "identity": current,
            "arithmetic": runtime.describe(),
            "device": ctx.device,
            "precision": ctx.precision,
            "determinism": ctx.determinism,
            "profile_values": ctx.profile.to_dict(),  # not compared: names the keys of a changed config
            "stages": {},
        }
        write_json(path, record)
        return record
    record = read_json(path)
    change = identities.describe_change(record["identity"], current)
    if change and "profile_values" in record and record["identity"].get("config") != current["config"]:
        keys = identities.profile_changes(record["profile_values"], ctx.profile.to_dict())
        change += "; the profile's " + (
            "changed keys: " + "; ".join(keys) if keys else "keys are equal, its file differs"
        )
    if change:
        profile = current["profile"] if current["profile"] in PROFILES else "PROFILE.toml"
        raise StateError(
            f"refusing to continue run {ctx.run}: {change}. "
            f"Nothing was written. To start afresh, use a new folder: "
            f"rlhf lab --out NEW_FOLDER --profile {profile} --revision {current['revision']}"
        )
    return record


def stage_complete(ctx: Context, stage: str) -> bool:
    path = ctx.run / RUN_FILE
    return path.is_file() and stage in read_json(path).get("stages", {})


def mark_complete(ctx: Context, stage: str, **info) -> None:
    """Record in run.json that `stage` finished (the record is the one file rewritten in place,
    atomically, since it is meant to change)."""
    path = ctx.run / RUN_FILE
    record = read_json(path)
    record["stages"][stage] = {"complete": True, **info}
    write_json(path, record, overwrite=True)


def stop_rules_identity(profile: Profile) -> dict:
    """What stop_on_warning adds to a PPO identity: the hash of the frozen rules that may stop it
    ({} without the option). Refused when the rules file is missing or a named stop signal has
    no frozen rule (it could never stop PPO)."""
    if not profile.ppo.stop_on_warning:
        return {}
    if not signals.RULES_FILE.is_file():
        raise ValueError(f"[ppo] stop_on_warning needs the frozen warning rules {signals.RULES_FILE}")
    ruled = {rule.signal for rule in signals.frozen_rules()[0]}
    missing = [s for s in profile.ppo.stop_signals if s not in ruled]
    if missing:
        raise ValueError(
            f"[ppo] stop_signals {', '.join(missing)}: no frozen rule in {signals.RULES_FILE}, "
            "so it could never stop PPO"
        )
    return {"warning_rules": sha256_file(signals.RULES_FILE)}
