"""`rlhf export-verl`: hand a finished lab run to verl 0.9.1 (docs/scaling-out.md).

    rlhf export-verl --run RUN --out OUT [--nnodes M --gpus-per-node N --seeds K]

OUT is self-contained (the workers need no `rlhf` install):

    data/train.parquet       the 672 rollout prompts (no label: RL sees prompts only)
    data/test.parquet        the 180 test prompts, expected action as ground truth (metrics only)
    data/probe.parquet       the 20 probe contexts, expected action as ground truth (metrics only)
    data/preference_pairs/   the corpus's {prompt, chosen, rejected} pairs, byte for byte (TRL, OpenRLHF)
    data/demonstrations/     the 168 SFT demonstrations as {prompt, completion} (TRL's SFT format)
    models/actor/            merged SFT actor (Qwen2ForCausalLM, FP32), tokenizer whose chat template
                             renders the lab's prompt, generation stopping on the lab's EOS id only
    models/critic/           critic initialisation: merged SFT backbone + zero value head
                             (Qwen2ForTokenClassification, one label)
    models/judge/            the frozen judge: merged judge backbone + score head
                             (Qwen2ForSequenceClassification, one label; the head's bias, which
                             that class has no place for, is added by the reward manager)
    reward/lab_reward.py     compute_score (the rubric, metrics only) and LabJudgeRewardManager
                             (judge score + bias, -1 for a response cut without EOS, paid once
                             at the last response token)
    reward/lab_rubric.py     rlhf/rubric.py, vendored unchanged (imports nothing from rlhf)
    reward/reward_config.json  judge bias, truncation penalty, EOS id, response limit
    launch/overrides.txt     the Hydra overrides (paths as $EXPORT_DIR and seeds as $SEED)
    launch/launch.sh         runs verl's main_ppo once per seed
    launch/mapping.json      every SPEC §5-§6 hyperparameter: lab value, override, exact /
                             approximate / not expressible, and what the difference does
    manifest.json            SHA-256 of every file, the source run's identity, pinned versions

Refused before anything is written (ExportError, a ValueError): an existing OUT, a run whose
run.json does not list every stage complete, and a run whose corpus and role files do not all
belong to one revision (an r001 and r002 mix).

Merging: each adapted projection becomes one weight `W + (alpha/r) B A`, formed in FP32 and
kept in FP32 (rounding the merged weight to BF16 would move the judge's scores).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import torch

from rlhf.config import PROFILES, Profile, load_profile, profile_hash
from rlhf.corpus import PROBE_SPLIT, load_corpus
from rlhf.identities import base_model_sha256
from rlhf.io import atomic_folder, read_json, sha256_file, write_bytes, write_json, write_text
from rlhf.lora import lora_modules
from rlhf.models import check_tokenizer, directory_identity, load_tokenizer
from rlhf.roles import load_role, new_role
from rlhf.verl_launch import LAUNCH_SH, hyperparameters, overrides

VERL_VERSION = "0.9.1"
REQUIRED_STAGES = ("sft", "judge", "ppo", "evaluate", "shortcut_audit", "report")
# The judge's folder and role kind in a run.
JUDGE_FOLDER, JUDGE_KIND = "judge", "judge"
ROLE_FILES = {
    "sft": "sft/actor.safetensors",
    "judge": f"{JUDGE_FOLDER}/judge.safetensors",
    "ppo_actor": "ppo/actor.safetensors",
    "ppo_critic": "ppo/critic.safetensors",
}
HANDOFF_DIR = Path(__file__).parent / "verl_handoff"
RUBRIC_SOURCE = Path(__file__).parent / "rubric.py"
DATA_SOURCE = "officehelpprefs"
ABILITY = "office_help"

# The lab's prompt, exactly (rlhf.tokens.chat_prompt): one user turn, opened for the answer.
LAB_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ExportError(ValueError):
    """A run that cannot be handed off; nothing was written."""


# ------------------------------------------------------------------------------ the source run


def check_run(run: Path) -> dict:
    """run.json of a finished, single-revision lab run; ExportError naming the problem otherwise."""

    record_path = run / "run.json"
    if not record_path.is_file():
        raise ExportError(f"{run} is not a lab run: no run.json (make one with: rlhf lab --out {run})")
    record = read_json(record_path)
    missing = [s for s in REQUIRED_STAGES if not record.get("stages", {}).get(s, {}).get("complete")]
    if missing:
        raise ExportError(
            f"run {run} is unfinished: stage(s) {', '.join(missing)} not complete in run.json; "
            f"finish it first (rlhf lab --out {run}); nothing was written"
        )
    ident = record["identity"]
    corpus = load_corpus(run / "corpus")
    found = {"run.json": ident["revision"], "corpus/manifest.json": corpus.revision}
    corpus_sha = sha256_file(run / "corpus" / "manifest.json")
    mixed = [] if corpus_sha == ident["corpus"] else ["corpus/manifest.json (not the corpus run.json records)"]
    for rel in ROLE_FILES.values():
        side = read_json(run / f"{rel}.json")
        found[rel] = side["identity"].get("revision")
        if side["identity"].get("corpus") != ident["corpus"]:
            mixed.append(f"{rel} (trained on another corpus)")
    if len(set(found.values())) != 1 or mixed:
        detail = ", ".join(f"{k}: {v}" for k, v in found.items())
        raise ExportError(
            f"run {run} mixes revisions ({detail}{'; ' if mixed else ''}{', '.join(mixed)}): "
            f"one hand-off is one revision; export a run made with one --revision; "
            f"nothing was written"
        )
    return record


def run_profile(record: dict, profile_arg: str | None) -> Profile:
    """The profile the run was made with (by name, or --profile PATH), checked by its hash."""

    name = profile_arg or record["identity"]["profile"]
    if profile_arg is None and name not in PROFILES:
        raise ExportError(f"the run was made with profile {name!r} from a file; pass it: --profile PATH")
    profile = load_profile(name)
    if profile_hash(profile) != record["identity"]["config"]:
        raise ExportError(
            f"profile {name} is not the one the run was made with (its hash differs from "
            f"run.json's config {record['identity']['config'][:12]}); pass --profile PATH"
        )
    return profile


def run_model_dir(run: Path, record: dict, profile: Profile, model_dir) -> Path:

    path = Path(model_dir) if model_dir else run / "base_model"
    if not (path / "config.json").is_file():
        raise ExportError(f"no base model at {path}; profile {profile.name} needs --model-dir DIR")
    if base_model_sha256(directory_identity(path)) != record["identity"]["base_model"]:
        raise ExportError(
            f"the base model at {path} is not the one run {run} was trained on "
            f"(file hashes differ from run.json's base_model)"
        )
    return path


# ------------------------------------------------------------------------------ data


def prompt_messages(prompt: str) -> list[dict]:
    """The chat messages of one lab prompt (the exported template renders rlhf.tokens.chat_prompt)."""
    return [{"role": "user", "content": prompt}]


def data_rows(corpus) -> dict[str, list[dict]]:
    """train (672 rollout prompts), test (180) and probe (20 contexts) rows in verl's format.

    Labels (the expected action) appear in the held-out rows only, as `ground_truth`, for metrics."""

    learning, evaluation = corpus.learning_view(), corpus.evaluation_view()
    source = f"{DATA_SOURCE}/{corpus.revision}"

    def row(rec, index, ground_truth, population):
        return {
            "data_source": source,
            "prompt": prompt_messages(rec["prompt"]),
            "ability": ABILITY,
            "reward_model": {"style": "rubric" if ground_truth else "judge", "ground_truth": ground_truth},
            "extra_info": {
                "index": index,
                "document_id": rec["document_id"],
                "family": rec["family"],
                "split": rec["split"],
                "population": population,
            },
        }

    train = [row(r, i, "", "rollout") for i, r in enumerate(learning.rollout_prompts())]
    test_labels = {lab["document_id"]: lab["action"] for lab in evaluation.labels("pair", "test")}
    test = [row(r, i, str(test_labels[r["document_id"]]), "pair") for i, r in enumerate(evaluation.prompts("test"))]
    probe_labels = {lab["family"]: lab["action"] for lab in evaluation.labels("probe", PROBE_SPLIT)}
    seen: set[str] = set()
    probe: list[dict] = []
    for r in evaluation.prompts("probe"):  # 80 rows, four per context over one prompt: one row per context
        if r["family"] in seen:
            continue
        seen.add(r["family"])
        probe.append(row({**r, "document_id": r["family"]}, len(probe), str(probe_labels[r["family"]]), "probe"))
    return {"train": train, "test": test, "probe": probe}


def write_training_sets(data_dir: Path, corpus_dir: Path, corpus) -> None:
    """The route for training the judge and SFT at scale (TRL, OpenRLHF): the corpus's preference
    pairs copied byte for byte ({prompt, chosen, rejected}, TRL's explicit-prompt preference format),
    and the 168 demonstrations as {prompt, completion} (TRL's prompt-completion format)."""
    for f in sorted((corpus_dir / "exports" / "preference_pairs").glob("*.jsonl")):
        write_bytes(data_dir / "preference_pairs" / f.name, f.read_bytes())
    demos = corpus.learning_view().demonstrations("train")
    write_text(
        data_dir / "demonstrations" / "train.jsonl",
        "".join(
            json.dumps({"prompt": d["prompt"], "completion": d["response"]}, sort_keys=True, ensure_ascii=False) + "\n"
            for d in demos
        ),
    )


def parquet_bytes(rows: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


# ------------------------------------------------------------------------------ models


def merge_lora(model) -> None:
    """Replace every LoRALinear by its base nn.Linear with `W + (alpha/r) B A` (FP32, in place)."""

    for name, m in lora_modules(model).items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        base = m.base
        with torch.no_grad():
            delta = m.scaling * (m.lora_B.float() @ m.lora_A.float())  # [out, in] FP32
            base.weight.copy_((base.weight.float() + delta).to(base.weight.dtype))
        setattr(parent, child, base)


def _merged_role(kind: str, profile: Profile, model_dir: Path, state_file: Path, source_kind=None, adapters_only=False):

    role = new_role(kind, profile, model_dir)
    load_role(role, state_file, source_kind=source_kind, adapters_only=adapters_only)
    role.model.float()  # merged weights stay FP32 (module doc)
    merge_lora(role.model)
    return role


def _hf_config(causal_config, eos_id: int, pad_id: int, architecture: str):
    config = causal_config.__class__.from_dict(causal_config.to_dict())
    config.architectures = [architecture]
    config.eos_token_id, config.pad_token_id, config.bos_token_id = eos_id, pad_id, None
    config.num_labels = 1
    config.dtype = "float32"
    return config


def write_models(out: Path, profile: Profile, model_dir: Path, run: Path, tokenizer, eos_id: int, pad_id: int) -> dict:
    """Merged actor, critic initialisation and judge into out/models; returns the judge's head bias."""
    from transformers import GenerationConfig, Qwen2ForSequenceClassification, Qwen2ForTokenClassification

    sft = run / ROLE_FILES["sft"]
    actor = _merged_role("actor", profile, model_dir, sft)
    actor.model.config.eos_token_id, actor.model.config.pad_token_id = eos_id, pad_id
    actor.model.config.bos_token_id = None
    actor.model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, do_sample=True, temperature=1.0, top_k=0, top_p=1.0
    )
    actor.model.save_pretrained(out / "models" / "actor")

    critic = _merged_role("critic", profile, model_dir, sft, source_kind="actor", adapters_only=True)
    value_model = Qwen2ForTokenClassification(
        _hf_config(critic.model.config, eos_id, pad_id, "Qwen2ForTokenClassification")
    )
    value_model.model.load_state_dict(critic.model.model.state_dict())
    with torch.no_grad():
        value_model.score.weight.copy_(critic.head.weight)  # zeros: the lab's critic head at the start
        value_model.score.bias.copy_(critic.head.bias)
    value_model.save_pretrained(out / "models" / "critic")

    judge = _merged_role(JUDGE_KIND, profile, model_dir, run / ROLE_FILES["judge"])
    seq = Qwen2ForSequenceClassification(
        _hf_config(judge.model.config, eos_id, pad_id, "Qwen2ForSequenceClassification")
    )
    seq.model.load_state_dict(judge.model.model.state_dict())
    with torch.no_grad():
        seq.score.weight.copy_(judge.head.weight)
    seq.save_pretrained(out / "models" / "judge")
    for folder in ("actor", "critic", "judge"):
        tokenizer.save_pretrained(out / "models" / folder)
    return {"judge_bias": float(judge.head.bias.item())}


def handoff_tokenizer(model_dir: Path):
    """The run's tokenizer with the lab's chat template."""

    tokenizer = load_tokenizer(model_dir)
    tokenizer.chat_template = LAB_CHAT_TEMPLATE
    return tokenizer


# ------------------------------------------------------------------------------ the export


def pinned_versions() -> dict:

    out = {"verl": VERL_VERSION}
    for name in ("torch", "transformers", "pyarrow", "rlhf"):
        out[name] = metadata.version(name)
    return out


def export_verl(
    run, out, *, nnodes: int = 1, gpus_per_node: int = 1, seeds: int = 1, profile: str | None = None, model_dir=None
) -> dict:
    """Write the hand-off of the finished run `run` into the new folder `out`; returns the manifest."""
    run, out = Path(run), Path(out)
    if out.exists():
        raise ExportError(
            f"refusing to write into {out}: it exists (an export is never overwritten); choose a new --out folder"
        )
    for name, value in (("--nnodes", nnodes), ("--gpus-per-node", gpus_per_node), ("--seeds", seeds)):
        if not isinstance(value, int) or value < 1:
            raise ExportError(f"{name} must be a positive integer, got {value!r}")
    record = check_run(run)
    prof = run_profile(record, profile)
    base_dir = run_model_dir(run, record, prof, model_dir)

    corpus = load_corpus(run / "corpus")
    tokenizer = handoff_tokenizer(base_dir)
    eos_id, pad_id = check_tokenizer(prof, tokenizer)
    with atomic_folder(out) as tmp:
        for split, rows in data_rows(corpus).items():
            write_bytes(tmp / "data" / f"{split}.parquet", parquet_bytes(rows))
        write_training_sets(tmp / "data", run / "corpus", corpus)
        judge = write_models(tmp, prof, base_dir, run, tokenizer, eos_id, pad_id)
        write_text(tmp / "reward" / "lab_reward.py", (HANDOFF_DIR / "lab_reward.py").read_text())
        write_text(tmp / "reward" / "lab_rubric.py", RUBRIC_SOURCE.read_text())
        write_json(
            tmp / "reward" / "reward_config.json",
            {
                "judge_dir": "../models/judge",
                "judge_bias": judge["judge_bias"],
                "truncation_penalty": prof.ppo.truncation_penalty,
                "eos_id": eos_id,
                "pad_id": pad_id,
                "response_tokens": prof.limits.response_tokens,
            },
        )
        write_text(tmp / "launch" / "overrides.txt", "\n".join(overrides(prof, nnodes, gpus_per_node)) + "\n")
        launch = tmp / "launch" / "launch.sh"
        write_text(
            launch,
            LAUNCH_SH.format(
                verl=VERL_VERSION, seeds=seeds, data_seed=prof.seeds.data_order, sampling_seed=prof.seeds.ppo_sampling
            ),
        )
        launch.chmod(0o755)
        write_json(tmp / "launch" / "mapping.json", hyperparameters(prof, nnodes * gpus_per_node))
        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {
            "format": "rlhf-verl-handoff-1",
            "source_run": str(run.resolve()),
            "run_identity": record["identity"],
            "profile": prof.name,
            "role_files": {k: sha256_file(run / v) for k, v in ROLE_FILES.items()},
            "nnodes": nnodes,
            "gpus_per_node": gpus_per_node,
            "seeds": seeds,
            "eos_id": eos_id,
            "pad_id": pad_id,
            "versions": pinned_versions(),
            "files": files,
        }
        write_json(tmp / "manifest.json", manifest)
    return manifest
