"""Profiles: TOML files (rlhf/profiles/*.toml) read into frozen dataclasses, checked key by key.

One dataclass per TOML table; each field's `doc` says what the number is, and the TOML comments
say why a value was chosen. An unknown, missing or wrongly typed key, or a number outside its
declared range (`RANGES`: finite, and e.g. at least 1, greater than 0, in [0, 1]), is a
`ProfileError` that names the file, the table and the key (and the range and the value). Every
seed has one source, the `[seeds]` table; every function gets its numbers from the profile (no
default argument repeats a profile value).

    profile = load_profile("embedded")          # or a path to a TOML file
    profile.ppo.kl_coef                         # 0.02
    small = override(profile, {("ppo", "iterations"): 4})   # a checked, frozen copy
    text = profile_text_with(toml_text, "small", {("ppo", "iterations"): 4})   # the same, in a TOML file's text
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf import designs
from rlhf.io import dumps_json, sha256_text
from rlhf.signals import SIGNALS

PROFILE_DIR = Path(__file__).parent / "profiles"
PROFILES = ("embedded", "qwen2.5-0.5b")
DEFAULT_PROFILE = "embedded"


class ProfileError(ValueError):
    """A profile file that cannot be used: the message names the file, the table and the key."""


@dataclass(frozen=True)
class Range:
    """The values a profile number may take: finite, and between `lo` and `hi` (None: no bound),
    each bound closed or open."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def holds(self, v: float) -> bool:
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def __str__(self) -> str:
        if self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        if self.lo is None:
            return "a finite number"
        return f"{'greater than' if self.lo_open else 'at least'} {self.lo:g}"


FINITE = Range()
AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, lo_open=True)
UNIT = Range(0, 1)  # a share or a discount: 0 to 1, both included
OPEN_UNIT = Range(0, 1, lo_open=True, hi_open=True)


def doc(text: str, new_key: bool = False, **kwargs):
    """A dataclass field with its documentation (kept in the field's metadata, tested).

    `new_key`: an optional key added after profiles were already identified by their hash; left
    absent (None) it is left out of the profile's data too (`Profile.to_dict`), so every profile
    that does not set it keeps its identity, and so its committed runs and studies."""
    return field(metadata={"doc": text, "new_key": new_key}, **kwargs)


# The range of every number a profile holds, by (table, key): checked when a table is made (at
# load and at every override), before anything is written; a test checks every int and float key
# has one. An optional key is checked when set.
RANGES: dict[tuple[str, str], Range] = {
    ("runtime", "torch_threads"): AT_LEAST_0,  # 0: torch's default
    **{("model", k): AT_LEAST_1 for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads", "intermediate_size", "vocab_size")},
    ("model", "eos_token_id"): AT_LEAST_0,
    ("model", "pad_token_id"): AT_LEAST_0,
    **{("limits", k): AT_LEAST_1 for k in ("prompt_tokens", "response_tokens", "context_tokens")},
    **{("lora", k): AT_LEAST_1 for k in ("rank", "alpha", "expected_adapters", "expected_parameters")},
    **{("seeds", k): AT_LEAST_0 for k in ("torch", "lora", "judge_lora", "judge_head", "data_order",
                                          "ppo_sampling", "evaluation", "judge_refresh", "ppo_offset")},
    ("optim", "weight_decay"): AT_LEAST_0,
    ("optim", "warmup_ratio"): UNIT,
    ("optim", "min_lr_ratio"): UNIT,
    ("optim", "grad_clip_norm"): POSITIVE,
    **{(t, k): AT_LEAST_1 for t in ("sft", "judge")
       for k in ("epochs", "expected_updates", "max_updates_per_epoch", "max_validation_examples")},
    ("sft", "lr"): POSITIVE,
    ("judge", "lr"): POSITIVE,
    ("sft", "examples_per_update"): AT_LEAST_1,
    ("sft", "demonstration_stride"): AT_LEAST_1,
    ("judge", "pairs_per_update"): AT_LEAST_1,
    ("judge", "head_init_std"): AT_LEAST_0,
    **{("dpo", k): AT_LEAST_1 for k in ("epochs", "expected_updates", "max_updates_per_epoch",
                                        "max_validation_examples", "pairs_per_update")},
    ("dpo", "lr"): POSITIVE,
    ("dpo", "beta"): POSITIVE,
    **{("ppo", k): AT_LEAST_1 for k in ("iterations", "prompts_per_iteration", "updates_per_iteration",
                                        "resume_stop_iteration", "checkpoint_every", "max_new_tokens",
                                        "refresh_every", "refresh_prompts", "refresh_updates")},
    ("ppo", "actor_lr"): POSITIVE,
    ("ppo", "critic_lr"): POSITIVE,
    ("ppo", "kl_coef"): AT_LEAST_0,
    ("ppo", "truncation_penalty"): FINITE,
    ("ppo", "gamma"): UNIT,
    ("ppo", "lam"): UNIT,
    ("ppo", "clip"): OPEN_UNIT,
    ("ppo", "value_coef"): POSITIVE,
    ("ppo", "temperature"): POSITIVE,
    ("ppo", "score_mean"): FINITE,
    ("ppo", "score_sd"): POSITIVE,
    ("ppo", "refresh_lr_ratio"): POSITIVE,
    ("ppo", "ensemble_size"): Range(2),  # an ensemble of one is the judge
    ("ppo", "ensemble_lambda"): AT_LEAST_0,
    ("evaluation", "max_new_tokens"): AT_LEAST_1,
    ("evaluation", "max_units"): AT_LEAST_1,
}  # fmt: skip


class Table:
    """A profile table: its numbers checked against RANGES when it is made."""

    TABLE = ""  # the table's name in the TOML file

    def __post_init__(self):
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value, valid = getattr(self, f.name), RANGES.get((self.TABLE, f.name))
            if valid is not None and value is not None and not valid.holds(value):
                finite = "" if math.isfinite(value) or valid == FINITE else "a finite number "
                raise ProfileError(f"[{self.TABLE}] {f.name} must be {finite}{valid}, not {value}")


@dataclass(frozen=True)
class Runtime(Table):
    TABLE = "runtime"

    torch_threads: int = doc("torch CPU threads; 0 leaves torch's default (all cores)")
    last_logits_only: bool = doc(
        "generation projects only the last column of a full forward onto the vocabulary "
        "(qwen2.5-0.5b; off for the embedded profile, whose golden hashes used all)",
        default=False,
    )
    compute_dtype: str = doc(
        "dtype the frozen base computes in: 'auto' (the stored dtype, except BF16 weights on a CPU "
        "without native BF16 instructions: float32; rlhf.runtime.choose_dtype), 'float32' or 'bfloat16'",
        default="auto",
    )

    def __post_init__(self):
        super().__post_init__()
        if self.compute_dtype not in ("auto", "float32", "bfloat16"):
            raise ProfileError(
                f"[runtime] compute_dtype must be 'auto', 'float32' or 'bfloat16', not {self.compute_dtype!r}"
            )


@dataclass(frozen=True)
class Model(Table):
    TABLE = "model"

    kind: str = doc("'embedded' (built by `rlhf build-embedded`) or 'qwen2.5-0.5b' (downloaded weights)")
    architecture: str = doc("transformers class of the base model, e.g. Qwen2ForCausalLM")
    hidden_size: int = doc("width of the residual stream")
    num_hidden_layers: int = doc("decoder layers")
    num_attention_heads: int = doc("query heads per layer")
    num_key_value_heads: int = doc("key/value heads per layer (grouped-query attention)")
    intermediate_size: int = doc("width of the MLP's gate/up projections")
    vocab_size: int = doc("rows of the (tied) embedding matrix")
    tie_word_embeddings: bool = doc("the LM head shares the embedding matrix")
    dtype: str = doc("dtype of the frozen base weights: 'float32' or 'bfloat16'")
    eos_token: str | None = doc("EOS token text (embedded tokenizer), checked by the loader", default=None)
    pad_token: str | None = doc("padding token text (embedded tokenizer), checked by the loader", default=None)
    eos_token_id: int | None = doc("EOS token id the tokenizer must have (downloaded models)", default=None)
    pad_token_id: int | None = doc("padding token id the tokenizer must have (downloaded models)", default=None)
    repo_id: str | None = doc("model hub repository of the weights (downloaded models)", default=None)
    revision: str | None = doc("pinned hub commit of the weights (downloaded models)", default=None)
    allow_random_weights: bool = doc(
        "accept a directory whose weights are random (the --random-weights "
        "stand-in of the full shape); never true for a real run",
        default=False,
    )

    def shape(self) -> dict[str, int]:
        """The six numbers a base model's config.json must match (rlhf.models.check_config), and
        the shape rlhf.models.qwen2_config builds."""
        return {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
        }


@dataclass(frozen=True)
class Limits(Table):
    TABLE = "limits"

    prompt_tokens: int = doc("longest prompt, in the model's tokens; longer prompts are an error")
    response_tokens: int = doc("longest response; a response without EOS by then is truncated")
    context_tokens: int = doc("prompt + response window (prompt_tokens + response_tokens)")


@dataclass(frozen=True)
class Lora(Table):
    TABLE = "lora"

    rank: int = doc("r of every adapter")
    alpha: int = doc("scale numerator: the branch is scaled by alpha / rank")
    targets: tuple[str, ...] = doc("projection names that get an adapter in every layer")
    expected_adapters: int = doc("adapters per role (layers x targets), checked after wrapping")
    expected_parameters: int = doc("trainable LoRA parameters per role, checked after wrapping")


@dataclass(frozen=True)
class Seeds(Table):
    TABLE = "seeds"

    torch: int = doc("global torch seed and the system RNGs before each stage")
    lora: int = doc("generator of the actor's (and so reference's and critic's) LoRA A matrices")
    judge_lora: int = doc("generator of the judge's LoRA A matrices")
    judge_head: int = doc("generator of the judge head's N(0, head_init_std) weight")
    data_order: int = doc("generators of SFT/judge data order and of the PPO prompt sampler")
    ppo_sampling: int = doc("generator of PPO's token sampling")
    evaluation: int = doc("held-out sampling (temperature 1) and the bootstrap intervals")
    judge_refresh: int = doc(
        "reward design 'iterated-judge' only: the generator of each judge refresh (its prompts, answers and "
        "update batches)",
        default=449,
    )
    ppo_offset: int | None = doc(
        "added to every seed PPO draws from (the system RNGs at its start, its prompt order, its token sampling, "
        "the judge refresh): PPO run again from the same SFT and judge with other draws (a nested study's PPO "
        "seed); absent: 0",
        default=None,
        new_key=True,
    )

    def ppo(self, name: str) -> int:
        """The seed `name` as PPO draws from it: the profile's value plus ppo_offset."""
        return getattr(self, name) + (self.ppo_offset or 0)


@dataclass(frozen=True)
class Optim(Table):
    TABLE = "optim"

    weight_decay: float = doc("AdamW decoupled weight decay (every optimizer)")
    warmup_ratio: float = doc("linear warm-up over max(1, int(warmup_ratio * total)) updates")
    min_lr_ratio: float = doc("the linear decay ends at min_lr_ratio * peak on the last update")
    grad_clip_norm: float = doc("global gradient-norm clip of every update")


@dataclass(frozen=True, kw_only=True)
class EpochStage(Table):
    """What the [sft] and [judge] tables share: a fixed budget of epochs over a train set."""

    epochs: int = doc("passes over the train set (SFT: the 168 demonstrations; judge: the 840 preference pairs)")
    lr: float = doc("peak learning rate of the role's adapters (and of the judge's head)")
    expected_updates: int = doc("total updates, checked before training")
    max_updates_per_epoch: int | None = doc(
        "cut each epoch short (miniature budgets for tests and dry runs); absent in a real profile", default=None
    )
    max_validation_examples: int | None = doc(
        "cut the validation set to its first N (miniature budgets); absent in a real profile", default=None
    )


@dataclass(frozen=True, kw_only=True)
class Sft(EpochStage):
    TABLE = "sft"

    examples_per_update: int = doc("demonstrations per optimizer update")
    demonstration_stride: int | None = doc(
        "train on every k-th of the train demonstrations in family order (k = 2: 84 of the 168), so each "
        "situation keeps its share; absent: every one (a testbed recipe of rlhf.studies.testbed)",
        default=None,
        new_key=True,
    )


@dataclass(frozen=True, kw_only=True)
class Judge(EpochStage):
    TABLE = "judge"

    pairs_per_update: int = doc("preference pairs per optimizer update")
    head_init_std: float = doc("standard deviation of the judge head's initial weight (bias 0)")


@dataclass(frozen=True, kw_only=True)
class Dpo(EpochStage):
    """A DPO arm's budget (rlhf.dpo): declared by the study that runs the arm, not a table of the
    lab's profiles (the lab trains PPO). Its learning rate is PPO's actor's (`rlhf.dpo.budget`)."""

    TABLE = "dpo"

    beta: float = doc("DPO's beta: how far the implicit reward beta * log(pi / pi_ref) may move")
    pairs_per_update: int = doc("preference pairs per optimizer update")


STUDY_TABLES = (Dpo,)  # tables a study declares beside the profile, range-checked as its tables are


@dataclass(frozen=True)
class Ppo(Table):
    TABLE = "ppo"

    iterations: int = doc("rollout-then-update iterations")
    prompts_per_iteration: int = doc("prompts sampled (one response each) per iteration")
    updates_per_iteration: int = doc("actor and critic updates over each iteration's rollouts")
    actor_lr: float = doc("peak learning rate of the actor's adapters")
    critic_lr: float = doc("peak learning rate of the critic's adapters and head")
    kl_coef: float = doc("per-token penalty -kl_coef * (logp_old - logp_ref) in the reward")
    truncation_penalty: float = doc("added to the judge's score of a response without EOS")
    gamma: float = doc("discount of GAE")
    lam: float = doc("lambda of GAE")
    clip: float = doc("PPO ratio clip range epsilon")
    value_coef: float = doc("weight of the critic's squared error")
    temperature: float = doc("sampling temperature of rollouts")
    resume_stop_iteration: int = doc("the interrupt/resume protocol's boundary iteration")
    checkpoint_every: int = doc("each leg saves a crash checkpoint every this many iterations")
    max_new_tokens: int | None = doc(
        "cut rollouts to N new tokens (miniature budgets; a cut row is truncated); "
        "absent in a real profile: limits.response_tokens",
        default=None,
    )
    reward_design: str = doc(
        f"what the episode's last token receives (rlhf.designs): '{designs.DEFAULT}' (SPEC §6, the default), "
        f"or a declared alternative: {', '.join(repr(n) for n in designs.NAMES if n != designs.DEFAULT)}",
        default=designs.DEFAULT,
    )
    score_mean: float = doc("'standardised-judge' only: the judge's mean on SFT samples of train prompts", default=0.0)
    score_sd: float = doc("'standardised-judge' only: the judge's SD on SFT samples of train prompts", default=1.0)
    refresh_every: int = doc(
        "'iterated-judge' only: the judge is refreshed after every this many iterations (K), never after the last",
        default=5,
    )
    refresh_prompts: int = doc(
        "'iterated-judge' only: train prompts per refresh, two temperature-1 answers of the current actor each; "
        "a pair where exactly one answer is a rubric success becomes a labelled pair",
        default=32,
    )
    refresh_updates: int = doc(
        "'iterated-judge' only: Bradley-Terry updates of the judge per refresh, each of judge.pairs_per_update "
        "pairs, half from the policy pairs labelled so far and half from the corpus's train pairs",
        default=16,
    )
    refresh_lr_ratio: float = doc(
        "'iterated-judge' only: each refresh trains the judge at judge.lr times this (constant, a fresh AdamW)",
        default=1.0,
    )
    ensemble_size: int = doc(
        "'ensemble-*' only: judges in the ensemble (k): the lab's judge and k - 1 more from other seeds", default=4
    )
    ensemble_lambda: float = doc("'ensemble-uncertainty' only: the reward is mean - lambda * SD", default=1.0)
    stop_on_warning: bool = doc(
        "stop PPO after the first iteration where a frozen over-optimisation warning rule fires "
        "(rlhf/warning_rules.json, whose hash joins the PPO identity); off: warnings are printed only",
        default=False,
    )
    stop_signals: tuple[str, ...] = doc(
        "with stop_on_warning: the signals whose frozen rule may stop PPO (rlhf.signals.SIGNALS); "
        "empty: the first rule of any signal that fires",
        default=(),
    )

    def __post_init__(self):
        super().__post_init__()
        errors = designs.profile_errors(self)
        if errors:  # the first is named; a profile fixed and loaded again names the next
            raise ProfileError(f"[ppo] {errors[0]}")
        if self.stop_signals and not self.stop_on_warning:
            raise ProfileError("[ppo] stop_signals name the rules that stop PPO: set stop_on_warning = true with them")
        unknown = [s for s in self.stop_signals if s not in SIGNALS]
        if unknown or len(set(self.stop_signals)) != len(self.stop_signals):
            raise ProfileError(
                f"[ppo] stop_signals must be distinct names among {', '.join(SIGNALS)}; "
                f"not {', '.join(unknown) or 'repeated'}"
            )


@dataclass(frozen=True)
class Evaluation(Table):
    TABLE = "evaluation"

    max_new_tokens: int | None = doc(
        "cut held-out answers to N new tokens (miniature budgets); absent in a real profile: limits.response_tokens",
        default=None,
    )
    max_units: int | None = doc(
        "cut every held-out set to its first N independent units: N test families (their prompts, test pairs "
        "and shortcut-audit pairs) and N probe contexts (their rows and candidates); miniature budgets; "
        "absent in a real profile: every unit",
        default=None,
    )


@dataclass(frozen=True)
class Profile:
    name: str = doc("profile name, recorded in run.json")
    device: str = doc("'cpu' or 'cuda'; a CUDA profile is refused where torch sees no CUDA device")
    runtime: Runtime = doc("[runtime] table")
    model: Model = doc("[model] table")
    limits: Limits = doc("[limits] table")
    lora: Lora = doc("[lora] table")
    seeds: Seeds = doc("[seeds] table")
    optim: Optim = doc("[optim] table")
    sft: Sft = doc("[sft] table")
    judge: Judge = doc("[judge] table")
    ppo: Ppo = doc("[ppo] table")
    evaluation: Evaluation = doc("[evaluation] table (optional: only miniature budgets set it)", default=Evaluation())
    # The file it was read from: not part of the configuration (nor of its hash).
    source: Path | None = field(default=None, compare=False, metadata={"doc": "file the profile was read from"})

    def __post_init__(self):
        if self.runtime.compute_dtype == "bfloat16" and self.model.dtype == "float32":
            raise ProfileError(
                f"profile {self.name}: [runtime] compute_dtype 'bfloat16' would round the model's float32 "
                "weights (use 'auto' or 'float32')"
            )

    def to_dict(self) -> dict:
        """The configuration as plain data (tuples as lists), without `source`."""
        data = dataclasses.asdict(self)
        data.pop("source")
        for name, table in data.items():
            if isinstance(table, dict):
                for f in dataclasses.fields(getattr(self, name)):
                    if f.metadata.get("new_key") and table[f.name] is None:
                        del table[f.name]
        return data


TABLES = {f.name: f.type for f in dataclasses.fields(Profile)}


def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check_value(value, kind, where: str):
    """`value` as `kind` (int, float, str, bool, tuple[str, ...], or X | None), or ProfileError."""
    args = typing.get_args(kind)
    if type(None) in args:  # Optional: None is never written in TOML, so a present value is an X
        (inner,) = [a for a in args if a is not type(None)]
        return _check_value(value, inner, where)
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ProfileError(f"{where} must be a list of strings, got {value!r}")
        return tuple(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # `gamma = 1` means 1.0
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ProfileError(f"{where} must be {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _read_table(cls, data: dict, where: str):
    types = _field_types(cls)
    unknown = sorted(set(data) - set(types))
    if unknown:
        raise ProfileError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (known: {', '.join(types)})"
        )
    values = {}
    for f in dataclasses.fields(cls):
        if data.get(f.name) is None:  # absent (None only comes from to_dict of an optional key)
            if f.default is dataclasses.MISSING:
                raise ProfileError(f"{where}: missing key {f.name!r} ({f.metadata['doc']})")
            continue
        values[f.name] = _check_value(data[f.name], types[f.name], f"{where}: key {f.name!r}")
    try:
        return cls(**values)
    except ProfileError as err:  # a range or a check across keys (__post_init__): name the file too
        raise ProfileError(f"{where}: {str(err).removeprefix(f'[{cls.TABLE}] ')}") from None


def profile_from_dict(data: dict, source: str | Path = "<dict>") -> Profile:
    """A checked Profile from plain data (a parsed TOML file)."""
    types = _field_types(Profile)
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    unknown = sorted(set(tables) - set(TABLES)) + sorted(set(top) - {"name", "device"})
    if unknown:
        raise ProfileError(f"profile {source}: unknown table or key {', '.join(unknown)}")
    values = {}
    for key in ("name", "device"):
        if key not in top:
            raise ProfileError(f"profile {source}: missing top-level key {key!r}")
        values[key] = _check_value(top[key], types[key], f"profile {source}: key {key!r}")
    for name in TABLES:
        if name in ("name", "device", "source"):
            continue
        if name not in tables and all(f.default is not dataclasses.MISSING for f in dataclasses.fields(types[name])):
            tables[name] = {}  # a table whose every key is optional may be left out
        if name not in tables:
            raise ProfileError(f"profile {source}: missing table [{name}]")
        values[name] = _read_table(types[name], tables[name], f"profile {source}: table [{name}]")
    return Profile(**values, source=Path(source) if source != "<dict>" else None)


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> Profile:
    """Read a profile by name (`embedded`, `qwen2.5-0.5b`) or by path to a TOML file."""
    path = Path(name_or_path)
    if str(name_or_path) in PROFILES:
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise FileNotFoundError(
            f"unknown profile {name_or_path!r}: no file {path} (known profiles: {', '.join(PROFILES)})"
        )
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"profile {path}: not valid TOML ({e})") from None
    return profile_from_dict(data, path)


def override(profile: Profile, changes: Mapping[tuple[str | None, str], object]) -> Profile:
    """A copy of `profile` with `{(table, key): value}` changed, each value checked like a file's
    (a new name, budgets, seeds); `(None, "name")` changes a top-level key."""
    data = profile.to_dict()
    for (table, key), value in changes.items():
        target = data if table is None else data.get(table)
        table_keys = () if table is None else _field_types(_field_types(Profile)[table])  # a new key may be absent
        if target is None or not (key in target or key in table_keys):
            raise ProfileError(f"override of profile {profile.name}: no key {key!r} in table [{table}]")
        target[key] = value
    return profile_from_dict(data, profile.source or "<dict>")


def profile_hash(profile: Profile) -> str:
    """SHA-256 of the profile's canonical JSON: the identity of a configuration."""
    return sha256_text(dumps_json(profile.to_dict()))


def toml_value(value) -> str:
    """An integer, a finite float, a string, a boolean or a tuple of strings as a TOML value (the
    kinds a profile is written with); a float is written with repr, which reads back as the same
    float."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ProfileError(f"only finite numbers are written into a profile, not {value!r}")
        return repr(value)
    if not isinstance(value, (int, str)):
        raise ProfileError(
            f"only integers, floats, strings, booleans and tuples of strings are written into a profile, not {value!r}"
        )
    return str(value) if isinstance(value, int) else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def profile_text_with(text: str, name: str, changes: dict[tuple[str, str], object]) -> str:
    """The profile TOML `text` with its name and the (table, key) entries of `changes` replaced
    (an absent key is added at the end of its table, an absent table at the end of the text);
    comments elsewhere are kept. The file
    form of `override`: `load_profile` of the result equals `override(profile, {(None, "name"):
    name, **changes})`."""
    text, n = re.subn(r'^name = ".*"$', f"name = {toml_value(name)}", text, count=1, flags=re.M)
    if n != 1:
        raise ProfileError('the profile has no top-level `name = "..."` line')
    for (table, key), value in changes.items():
        head = text.find(f"\n[{table}]\n")
        if head < 0 and table in TABLES:  # an optional table (every key has a default): added at the end
            text = text.rstrip("\n") + f"\n\n[{table}]\n"
            head = text.find(f"\n[{table}]\n")
        if head < 0:
            raise ProfileError(f"the profile has no [{table}] table")
        end = text.find("\n[", head + 1)
        end = len(text) if end < 0 else end
        body, n = re.subn(
            rf"^{re.escape(key)} = .*$", f"{key} = {toml_value(value)}", text[head:end], count=1, flags=re.M
        )
        if n == 0:
            body = body.rstrip("\n") + f"\n{key} = {toml_value(value)}\n"
        text = text[:head] + body + text[end:]
    return text
