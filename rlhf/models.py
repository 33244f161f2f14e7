"""One model loader for both profiles, from a local directory only.

`load_base(profile, model_dir)` verifies the architecture, every shape number of the profile,
tied input/output embeddings, the parameter dtype and the tokenizer's EOS/PAD ids, then returns
the base frozen and in `eval()`. For `qwen2.5-0.5b` it also checks that the directory holds the
pinned revision. For every profile, the weight, config and tokenizer files must still have the
SHA-256 that the directory's build manifest or fetch marker recorded (`check_recorded_files`):
replaced weights are refused by their hash, whatever a marker says. It never touches the
network: `fetch_model` (command `rlhf fetch-model`) is the one explicit download, for people who
have network access.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlhf import costs, runtime
from rlhf.config import Profile
from rlhf.io import ArtifactExists, atomic_folder, dumps_json, read_json, sha256_file, write_text
from rlhf.scoring import set_token_count
from rlhf.tokens import Tokens

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FETCH_MARKER = "rlhf-fetch.json"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
# What `fetch_model` downloads: weights, config and tokenizer files, nothing else.
FETCH_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
]


class ModelCheckError(ValueError):
    """The model directory does not match the profile."""


@dataclass
class Base:
    model: PreTrainedModel  # a Qwen2ForCausalLM
    tokenizer: object
    eos_id: int
    pad_id: int
    identity: dict = field(default_factory=dict)
    # The kept base `model` was copied from (load_base), or None: what a role proves itself equal
    # to instead of hashing its frozen tensors again (rlhf.roles.inherit_frozen_hashes).
    copied_from: PreTrainedModel | None = None

    @property
    def tokens(self) -> Tokens:
        """The tokenizer and its EOS and PAD ids as PPO samples and scores with them."""
        return Tokens(self.tokenizer, self.eos_id, self.pad_id)


def how_to_get(profile: Profile, model_dir) -> str:
    if profile.model.kind == "embedded":
        return f"build it with: rlhf build-embedded --out {model_dir}"
    return (
        f"download it (needs network access) with: rlhf fetch-model --out {model_dir}  "
        f"(repo {profile.model.repo_id}, revision {profile.model.revision})"
    )


def check_config(profile: Profile, config) -> None:
    """Compare a transformers config with the profile's model section; raise on any mismatch."""
    spec = profile.model
    arch = list(getattr(config, "architectures", None) or [])
    if spec.architecture not in arch:
        raise ModelCheckError(f"architecture {arch} is not {spec.architecture}")
    for key, want in spec.shape().items():
        if getattr(config, key) != want:  # a transformers config, read by the names of its keys
            raise ModelCheckError(f"{key} is {getattr(config, key)}, profile {profile.name} requires {want}")
    if not config.tie_word_embeddings:
        raise ModelCheckError("input and output embeddings are not tied (tie_word_embeddings false)")
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    stored = str(stored).replace("torch.", "")
    if stored != spec.dtype:
        raise ModelCheckError(f"checkpoint dtype is {stored}, profile {profile.name} requires {spec.dtype}")


def check_revision(profile: Profile, model_dir: Path) -> str:
    """The pinned revision, read from our fetch marker or huggingface_hub's download metadata."""
    want = profile.model.revision
    marker = model_dir / FETCH_MARKER
    if marker.is_file() and read_json(marker).get("random_weights"):
        # A random-weight stand-in of the full shape (time/memory runs without the download):
        # accepted only when the caller's profile says so, and recorded as such.
        if not profile.model.allow_random_weights:
            raise ModelCheckError(
                f"{model_dir} holds RANDOM weights of the {profile.name} shape, not "
                f"revision {want}; {how_to_get(profile, model_dir)}"
            )
        return "random-weights"
    if marker.is_file():
        got = read_json(marker).get("revision")
    else:
        meta = model_dir / ".cache" / "huggingface" / "download" / "config.json.metadata"
        got = meta.read_text().split("\n")[0].strip() if meta.is_file() else None
    if got != want:
        raise ModelCheckError(
            f"{model_dir} holds revision {got!r}, profile {profile.name} pins {want}; {how_to_get(profile, model_dir)}"
        )
    return got


def check_tokenizer(profile: Profile, tokenizer) -> tuple[int, int]:
    spec = profile.model
    eos_tok = spec.eos_token or "<|im_end|>"
    pad_tok = spec.pad_token or "<|endoftext|>"
    eos_id = tokenizer.convert_tokens_to_ids(eos_tok)
    pad_id = tokenizer.convert_tokens_to_ids(pad_tok)
    for name, got, want in (("EOS", eos_id, spec.eos_token_id), ("PAD", pad_id, spec.pad_token_id)):
        if got is None or tokenizer.convert_ids_to_tokens(got) != (eos_tok if name == "EOS" else pad_tok):
            raise ModelCheckError(f"tokenizer has no {name} token")
        if want is not None and got != want:
            raise ModelCheckError(f"tokenizer {name} id is {got}, profile requires {want}")
    if eos_id == pad_id:
        raise ModelCheckError("EOS and PAD must be different tokens")
    return eos_id, pad_id


def compute_dtype(profile: Profile) -> dict:
    """The dtype the profile's base computes in on its device, and why (rlhf.runtime.choose_dtype:
    [runtime] compute_dtype, `--dtype`; BF16 weights on a CPU without native BF16 compute in
    float32). Recorded in run.json and in every identity."""
    return runtime.choose_dtype(profile.model.dtype, profile.device, profile.runtime.compute_dtype)


def precision_line(precision: dict) -> str:
    """What `rlhf lab` and the dry run print about the dtype the base computes in."""
    force = f"; {precision['force']} forces the other" if precision["force"] else ""
    stored = f"stored in {precision['stored']}"
    why = precision["reason"] if stored in precision["reason"] else f"weights {stored}; {precision['reason']}"
    return f"precision: {precision['dtype']} ({why}{force})"


def check_model(profile: Profile, model, dtype_name: str | None = None) -> None:
    """Tied embeddings, and every parameter in `dtype_name` (default: the compute dtype)."""
    dtype = DTYPES[dtype_name or compute_dtype(profile)["dtype"]]
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if emb.untyped_storage().data_ptr() != head.untyped_storage().data_ptr():
        raise ModelCheckError("lm_head and embed_tokens do not share one tensor (tying broken)")
    for name, p in model.named_parameters():
        if p.dtype != dtype:
            raise ModelCheckError(f"parameter {name} has dtype {p.dtype}, profile {profile.name} computes in {dtype}")


def freeze(model) -> None:
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()


def directory_identity(model_dir: Path) -> dict:
    """SHA-256 of every weight, config and tokenizer file in the directory."""
    return {
        p.name: sha256_file(p)
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name != FETCH_MARKER and not p.name.startswith(".")
    }


# Where a model directory records the SHA-256 of its files: `rlhf build-embedded` writes
# manifest.json, `rlhf fetch-model` the fetch marker; both under the key "files".
RECORDS = (FETCH_MARKER, "manifest.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def check_recorded_files(model_dir: Path, files: dict[str, str]) -> str | None:
    """Compare `files` (name -> SHA-256 of the directory now, as `directory_identity` gives it)
    with the hashes recorded when the directory was built or fetched; raise ModelCheckError
    naming each file that changed, went missing, or holds weights nobody recorded.

    Returns the name of the record used, or None when the directory records no hashes (a
    download made without `rlhf fetch-model`, or a random-weight stand-in).
    """
    model_dir = Path(model_dir)
    for name in RECORDS:
        record = model_dir / name
        recorded = read_json(record).get("files") if record.is_file() else None
        if recorded:
            break
    else:
        return None
    problems = []
    for file, digest in sorted(recorded.items()):
        if file not in files:
            problems.append(f"{file} is missing")
        elif files[file] != digest:
            problems.append(f"{file} has SHA-256 {files[file][:12]}..., {name} records {digest[:12]}...")
    problems += [
        f"{file} holds weights that {name} does not record"
        for file in sorted(files)
        if file not in recorded and file.endswith(WEIGHT_SUFFIXES)
    ]
    if problems:
        raise ModelCheckError(
            f"{model_dir} does not hold the files it was built or fetched with "
            f"(replaced or damaged): {'; '.join(problems)}"
        )
    return name


def load_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def load_base(
    profile: Profile, model_dir, *, device: str = "cpu", identity: dict | None = None, tokenizer=None
) -> Base:
    """Load and verify the frozen base of `profile` from the local directory `model_dir`: a copy
    of its own for the caller (each role owns its backbone, SPEC §4).

    `identity` (the directory's file hashes) and `tokenizer` (loaded from the same directory)
    may be passed in when the caller already has them: hashing a 1 GB checkpoint or parsing
    Qwen's 7 MB tokenizer.json (1.5 s) once is enough. Every call checks the folder against
    the profile (architecture, shape, revision, tokenizer, the recorded file hashes); the
    weights themselves are read from the folder once per process (`kept_base`) and copied.
    """
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars say what is happening
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"no model at {model_dir} (config.json missing); {how_to_get(profile, model_dir)}")
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    check_config(profile, config)
    revision = check_revision(profile, model_dir) if profile.model.revision is not None else None
    tokenizer = load_tokenizer(model_dir) if tokenizer is None else tokenizer
    eos_id, pad_id = check_tokenizer(profile, tokenizer)
    ident = dict(identity) if identity else {"files": directory_identity(model_dir)}
    check_recorded_files(model_dir, ident.get("files") or directory_identity(model_dir))
    # Loaded in the compute dtype: BF16 weights widened to float32 where the CPU has no native BF16.
    dtype_name = compute_dtype(profile)["dtype"]
    kept = kept_base(model_dir, ident.get("files") or {}, dtype_name, device, len(tokenizer))  # type: ignore[arg-type]
    model = copy.deepcopy(kept)
    check_model(profile, model)
    ident.update({"profile": profile.name, "revision": revision, "eos_id": eos_id, "pad_id": pad_id})
    return Base(model=model, tokenizer=tokenizer, eos_id=eos_id, pad_id=pad_id, identity=ident, copied_from=kept)


# The frozen base read from a model folder, kept for the process: every role is a copy of it
# (rlhf.roles.new_role), so a stage that builds roles for several legs reads 1 GB from disk
# and moves it to the device once, not once per role. One base is kept at a time, keyed by
# what makes its tensors: the folder's file hashes, the dtype, the device and the token count.
_KEPT: dict[tuple, Any] = {}


def kept_base(model_dir: Path, files: dict[str, str], dtype_name: str, device: str, n_tokens: int):
    """The frozen, eval-mode Qwen2ForCausalLM of `model_dir` in `dtype_name` on `device`, read
    from the folder on first use in this process (counted as a base load, rlhf.costs) and kept;
    never handed out itself, only copied (load_base)."""
    from transformers import Qwen2ForCausalLM

    key = (dumps_json(files), dtype_name, str(device), n_tokens)
    if key not in _KEPT:
        _KEPT.clear()  # one base at a time: a process that moves to another base frees the last
        model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES[dtype_name], local_files_only=True)
        model.to(device)  # type: ignore[arg-type]  # transformers' wrapped .to: its stub wants the model as argument
        freeze(model)
        set_token_count(model, n_tokens)
        costs.count("base_loads")
        _KEPT[key] = model
    return _KEPT[key]


def qwen2_config(profile: Profile, **extra):
    """transformers' Qwen2Config of the profile's shape (rlhf.config.Model.shape), embeddings tied, with
    Qwen2.5's position and norm settings (32,768 positions, RoPE theta 1e6, RMSNorm eps 1e-6);
    `extra` adds or replaces keys. The random-weight base and the tests that build a model of a
    profile's shape use this one builder."""
    from transformers import Qwen2Config

    spec = profile.model
    settings = {"tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1000000.0}
    shape: dict[str, Any] = spec.shape()  # ints, for keywords of many types
    return Qwen2Config(**shape, **{**settings, "rms_norm_eps": 1e-6, **extra})


def random_base(
    profile: Profile, tokenizer, *, seed: int = 0, device: str = "cpu", dtype_name: str | None = None
) -> Base:
    """The profile's full shape with random weights (time/memory runs without the download),
    rounded to the stored dtype, then held in `dtype_name` (default: the compute dtype; a model
    directory is written in the stored one)."""
    from transformers import Qwen2ForCausalLM

    spec = profile.model
    eos_id, pad_id = check_tokenizer(profile, tokenizer)
    config = qwen2_config(
        profile,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        architectures=[spec.architecture],
        dtype=spec.dtype,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(DTYPES[spec.dtype])  # type: ignore[arg-type]  # transformers' wrapped .to: its stub wants the model as argument
    check_config(profile, model.config)
    dtype_name = dtype_name or compute_dtype(profile)["dtype"]
    model.to(DTYPES[dtype_name])  # type: ignore[arg-type]  # widening BF16 to float32 is exact
    check_model(profile, model, dtype_name)
    freeze(model)
    set_token_count(model, len(tokenizer))  # type: ignore[arg-type]  # a transformers tokenizer has a length
    return Base(
        model=model,
        tokenizer=tokenizer,
        eos_id=eos_id,
        pad_id=pad_id,
        identity={"profile": profile.name, "random_weights_seed": seed},
    )


def fetch_model(profile: Profile, out_dir, *, snapshot_download=None) -> Path:
    """Download the profile's pinned revision into `out_dir` (which must not exist or be empty)."""
    if profile.model.revision is None:
        raise ValueError(
            f"profile {profile.name} has no downloadable model (the embedded base is built with `rlhf build-embedded`)"
        )
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ArtifactExists(f"refusing to download into non-empty directory {out_dir}")
    if snapshot_download is None:
        from huggingface_hub import snapshot_download
    spec = profile.model
    with atomic_folder(out_dir) as tmp:
        snapshot_download(
            repo_id=spec.repo_id, revision=spec.revision, local_dir=str(tmp), allow_patterns=FETCH_PATTERNS
        )
        write_text(
            tmp / FETCH_MARKER,
            dumps_json({"repo_id": spec.repo_id, "revision": spec.revision, "files": directory_identity(tmp)}),
        )
    return out_dir


def write_random_model_dir(profile: Profile, out_dir, tokenizer_file, *, seed: int = 0, device: str = "cpu") -> Path:
    """A model directory with the profile's full shape and RANDOM weights (drawn on `device`:
    the GPU draws Qwen2.5-0.5B's in seconds, the CPU in about a minute), plus a tokenizer.

    For measuring time and memory of the qwen2.5-0.5b profile without the download
    (`pytest -m gpu --random-weights`). The marker says `random_weights: true`; the loader
    refuses such a directory unless the profile sets `allow_random_weights`.
    """
    from transformers import PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ArtifactExists(f"refusing to overwrite non-empty directory {out_dir}")
    if (Path(tokenizer_file).parent / "tokenizer_config.json").is_file():
        # The tokenizer's own config beside it (special tokens, chat template), as a real model has.
        tokenizer = load_tokenizer(Path(tokenizer_file).parent)
    else:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(tokenizer_file), eos_token="<|im_end|>", pad_token="<|endoftext|>"
        )
    base = random_base(
        profile, tokenizer, seed=seed, device=device, dtype_name=profile.model.dtype
    )  # stored as the profile says
    with atomic_folder(out_dir) as tmp:
        base.model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_text(
            tmp / FETCH_MARKER, dumps_json({"random_weights": True, "seed": seed, "shape_of": profile.model.revision})
        )
    return out_dir
