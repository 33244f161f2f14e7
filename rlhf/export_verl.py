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
import math
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


# ------------------------------------------------------------------------------ launch


def lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


# The verl config groups the overrides set.
ACTOR, CRITIC, ROLLOUT, ALGO = "actor_rollout_ref.actor", "critic", "actor_rollout_ref.rollout", "algorithm"
# (status, consequence) of what the lab trains and the hand-off does not.
NOT_TRAINED = (
    "not expressible",
    "the PPO hand-off starts from the trained SFT actor and judge; "
    "training them at scale goes through TRL or OpenRLHF on the exported pairs and "
    "demonstrations (docs/scaling-out.md)",
)
Row = tuple  # (name, lab value, verl overrides, status, consequence): one hyperparameter


def _sft_and_judge_rows(profile: Profile) -> list[Row]:
    """SFT and the judge: trained by the lab, not by the hand-off."""
    sft, judge = profile.sft, profile.judge
    return [
        ("sft.epochs", sft.epochs, [], *NOT_TRAINED),
        ("sft.examples_per_update", sft.examples_per_update, [], *NOT_TRAINED),
        ("sft.lr", sft.lr, [], *NOT_TRAINED),
        ("sft.loss", "token sum / active tokens of the update", [], *NOT_TRAINED),
        ("judge.epochs", judge.epochs, [], *NOT_TRAINED),
        ("judge.pairs_per_update", judge.pairs_per_update, [], *NOT_TRAINED),
        ("judge.lr", judge.lr, [], *NOT_TRAINED),
        ("judge.loss", "-mean(logsigmoid(r_chosen - r_rejected))", [], *NOT_TRAINED),
    ]


def _rollout_rows(profile: Profile, n_gpus: int) -> list[Row]:
    """Token limits, sampling, the batch and the number of updates and iterations."""
    ppo, limits = profile.ppo, profile.limits
    batch = ppo.prompts_per_iteration
    verl_batch = lcm(batch, n_gpus)  # verl needs the batch divisible by the GPU count
    # fmt: off
    return [
        ("limits.prompt_tokens", limits.prompt_tokens,
         [f"data.max_prompt_length={limits.prompt_tokens}", "data.filter_overlong_prompts=True",
          "data.truncation=error"], "exact", "no exported prompt is over the limit (checked: none filtered)"),
        ("limits.response_tokens", limits.response_tokens, [f"data.max_response_length={limits.response_tokens}"],
         "exact", "a response is cut at the same length"),
        ("limits.context_tokens", limits.context_tokens, [], "exact",
         "implied: prompt + response limits sum to the context limit"),
        ("ppo.temperature", ppo.temperature,
         [f"{ROLLOUT}.temperature={ppo.temperature}", f"{ROLLOUT}.top_k=-1", f"{ROLLOUT}.top_p=1.0"], "approximate",
         "no top-k/top-p; the lab draws only the tokenizer's ids, verl's rollout every vocabulary row "
         "(the rows past the tokenizer's last id are padding, unlikely but not impossible to draw)"),
        ("ppo.prompts_per_iteration", batch,
         [f"data.train_batch_size={verl_batch}", f"{ROLLOUT}.n=1", f"{ACTOR}.ppo_mini_batch_size={verl_batch}",
          f"{CRITIC}.ppo_mini_batch_size={verl_batch}"],
         "exact" if verl_batch == batch else "approximate",
         "one rollout per prompt, one mini-batch per update" + (
             "" if verl_batch == batch
             else f"; {verl_batch} prompts per iteration, because verl needs the batch divisible by the "
                  f"{n_gpus} GPUs")),
        ("ppo.updates_per_iteration", ppo.updates_per_iteration,
         [f"{ACTOR}.ppo_epochs={ppo.updates_per_iteration}", f"{CRITIC}.ppo_epochs={ppo.updates_per_iteration}",
          f"{ACTOR}.shuffle=False"], "exact", "old log-probs and values fixed across both updates"),
        ("ppo.iterations", ppo.iterations, [f"trainer.total_training_steps={ppo.iterations}"], "exact",
         "one verl training step is one lab iteration"),
    ]
    # fmt: on


def _reward_and_loss_rows(profile: Profile) -> list[Row]:
    """The reward (penalty, truncation, judge score), GAE and the two losses."""
    ppo = profile.ppo
    # fmt: off
    return [
        ("ppo.kl_coef", ppo.kl_coef,
         [f"{ALGO}.use_kl_in_reward=True", f"{ALGO}.kl_penalty=kl", f"{ALGO}.kl_ctrl.type=fixed",
          f"{ALGO}.kl_ctrl.kl_coef={ppo.kl_coef}", f"{ACTOR}.use_kl_loss=False"], "exact",
         "the sampled-token log-ratio penalty in every token's reward (checked against rlhf.ppo_math)"),
        ("logp_old", "the sampling actor's log-prob", [], "approximate",
         "verl's old log-probs are the training engine's teacher-forced recomputation, not the sampler's; "
         "the lab records that difference before its first update"),
        ("ppo.truncation_penalty", ppo.truncation_penalty, ["reward manager (reward/lab_reward.py)"], "exact",
         "paid with the judge score, once, at the last response token (checked)"),
        ("judge score", "once at the last active token", ["reward manager (reward/lab_reward.py)"], "exact",
         "judge scores equal the lab's on fixed answers, truncated ones included (checked)"),
        ("ppo.gamma", ppo.gamma, [f"{ALGO}.gamma={ppo.gamma}", f"{ALGO}.adv_estimator=gae"], "exact",
         "GAE returns equal the lab's (checked)"),
        ("ppo.lam", ppo.lam, [f"{ALGO}.lam={ppo.lam}"], "exact", "GAE returns equal the lab's (checked)"),
        ("advantage whitening", "none", [], "not expressible",
         "verl 0.9.1 always whitens GAE advantages over the batch: the actor's step sizes and the sign of "
         "small advantages differ from the lab's (returns and the critic's targets are unchanged; checked)"),
        ("ppo.clip", ppo.clip,
         [f"{ACTOR}.clip_ratio={ppo.clip}", f"{ACTOR}.clip_ratio_low={ppo.clip}", f"{ACTOR}.clip_ratio_high={ppo.clip}",
          f"{ACTOR}.clip_ratio_c=1e9"], "exact", "dual clip pushed out of reach: the lab has none"),
        ("loss averaging", "per response over its tokens, then over responses",
         [f"{ACTOR}.loss_agg_mode=seq-mean-token-mean", f"{CRITIC}.loss_agg_mode=seq-mean-token-mean"], "exact",
         "long answers get no extra weight"),
        ("ppo.value_coef", ppo.value_coef, [f"{CRITIC}.cliprange_value=1e9"], "exact",
         "verl's value loss is 0.5 * squared error; value clipping pushed out of reach"),
        ("entropy bonus", 0, [f"{ACTOR}.entropy_coeff=0"], "exact", "none"),
    ]
    # fmt: on


def _optimizer_rows(profile: Profile) -> list[Row]:
    """The two AdamW optimizers and their schedule."""
    ppo, optim = profile.ppo, profile.optim
    # fmt: off
    return [
        ("ppo.actor_lr", ppo.actor_lr, [f"{ACTOR}.optim.lr={ppo.actor_lr}"], "exact", "peak learning rate"),
        ("ppo.critic_lr", ppo.critic_lr, [f"{CRITIC}.optim.lr={ppo.critic_lr}"], "exact", "peak learning rate"),
        ("optim.weight_decay", optim.weight_decay,
         [f"{ACTOR}.optim.weight_decay={optim.weight_decay}", f"{CRITIC}.optim.weight_decay={optim.weight_decay}"],
         "exact", "AdamW, two optimizers"),
        ("optim.grad_clip_norm", optim.grad_clip_norm,
         [f"{ACTOR}.grad_clip={optim.grad_clip_norm}", f"{CRITIC}.grad_clip={optim.grad_clip_norm}"], "exact",
         "clipped per optimizer"),
        ("optim.warmup_ratio", optim.warmup_ratio,
         [f"{ACTOR}.optim.lr_warmup_steps_ratio={optim.warmup_ratio}",
          f"{CRITIC}.optim.lr_warmup_steps_ratio={optim.warmup_ratio}"], "approximate",
         "verl's warm-up starts at 0 (its first iteration learns nothing) where the lab's first update runs at "
         "peak/warm; verl steps its schedule once per iteration, the lab once per update (both updates of an "
         "iteration share one rate)"),
        ("optim.min_lr_ratio (linear decay)", optim.min_lr_ratio,
         [f"{ACTOR}.optim.lr_scheduler_type=cosine", f"{ACTOR}.optim.min_lr_ratio={optim.min_lr_ratio}",
          f"{CRITIC}.optim.lr_scheduler_type=cosine", f"{CRITIC}.optim.min_lr_ratio={optim.min_lr_ratio}"],
         "approximate",
         "verl 0.9.1 has only constant and cosine: a cosine to 10% of peak, above the lab's linear decay in the "
         "first half and below it in the second"),
    ]
    # fmt: on


def _model_rows(profile: Profile) -> list[Row]:
    """LoRA on actor and critic, seeds and the dtype."""
    # fmt: off
    return [
        ("lora (actor)", f"r {profile.lora.rank}, alpha {profile.lora.alpha}",
         [f"actor_rollout_ref.model.lora_rank={profile.lora.rank}",
          f"actor_rollout_ref.model.lora_alpha={profile.lora.alpha}",
          "actor_rollout_ref.model.target_modules=[" + ",".join(profile.lora.targets) + "]"], "approximate",
         "a fresh adapter over the merged SFT weights: the same function at the start, not the same parameters "
         "(the lab keeps training the SFT adapter itself)"),
        ("lora (critic)", f"r {profile.lora.rank} on the SFT adapter + zero head", [], "not expressible",
         "verl 0.9.1 cannot put LoRA on the critic: a full-parameter critic, far more trainable parameters at "
         "the same learning rate, and far more memory"),
        ("seeds", f"data_order {profile.seeds.data_order}, ppo_sampling {profile.seeds.ppo_sampling}",
         ["data.shuffle=True", "data.seed=$DATA_SEED", f"{ROLLOUT}.seed=$SAMPLING_SEED"], "not expressible",
         "no bit-identical draws: verl's sampler, its rollout engine and its LoRA initialisation use their own "
         "generators; compare runs by distributions over seeds, not by tokens"),
        ("dtype", profile.model.dtype, [f"{ROLLOUT}.dtype=bfloat16"], "approximate",
         "the engine samples in BF16; the lab's embedded model runs in FP32"),
    ]
    # fmt: on


def hyperparameters(profile: Profile, n_gpus: int) -> list[dict]:
    """Every SPEC §5-§6 hyperparameter: lab value, verl override(s), status, consequence.

    status: "exact", "approximate" or "not expressible". The one place the profile's numbers
    are read for the hand-off (launch/overrides.txt and launch/mapping.json come from here)."""
    rows = (
        _sft_and_judge_rows(profile)
        + _rollout_rows(profile, n_gpus)
        + _reward_and_loss_rows(profile)
        + _optimizer_rows(profile)
        + _model_rows(profile)
    )
    keys = ("hyperparameter", "lab", "overrides", "status", "consequence")
    return [dict(zip(keys, r)) for r in rows]


def overrides(profile: Profile, nnodes: int, gpus_per_node: int) -> list[str]:
    """The Hydra overrides of launch/overrides.txt ($EXPORT_DIR, $SEED, $DATA_SEED, $SAMPLING_SEED
    are filled in by launch.sh)."""
    mapped = [o for row in hyperparameters(profile, nnodes * gpus_per_node) for o in row["overrides"] if "=" in o]
    paths = [
        "data.train_files=$EXPORT_DIR/data/train.parquet",
        "data.val_files=[$EXPORT_DIR/data/test.parquet,$EXPORT_DIR/data/probe.parquet]",
        "data.prompt_key=prompt",
        "actor_rollout_ref.model.path=$EXPORT_DIR/models/actor",
        "critic.model.path=$EXPORT_DIR/models/critic",
        "critic.model.tokenizer_path=$EXPORT_DIR/models/actor",
        "reward.custom_reward_function.path=$EXPORT_DIR/reward/lab_reward.py",
        "reward.custom_reward_function.name=compute_score",
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.name=LabJudgeRewardManager",
        "reward.reward_manager.module.path=$EXPORT_DIR/reward/lab_reward.py",
    ]
    engine = [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "critic.ppo_micro_batch_size_per_gpu=1",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={gpus_per_node}",
        "trainer.critic_warmup=0",
        "trainer.val_before_train=True",
        "trainer.logger=[console]",
        "trainer.project_name=rlhf-officehelp",
        "trainer.experiment_name=lab-seed$SEED",
        "trainer.default_local_dir=$EXPORT_DIR/checkpoints/seed$SEED",
    ]
    return paths + mapped + engine


LAUNCH_SH = """#!/usr/bin/env bash
# Runs verl {verl}'s PPO on this hand-off once per seed (written by `rlhf export-verl`).
# Needs verl=={verl} and its engine on the cluster; run from anywhere; extra arguments are passed
# to verl as further Hydra overrides.
set -euo pipefail
EXPORT_DIR=$(cd "$(dirname "$0")/.." && pwd)
SEEDS=${{SEEDS:-{seeds}}}
for ((k = 0; k < SEEDS; k++)); do
    SEED=$k; DATA_SEED=$(({data_seed} + k)); SAMPLING_SEED=$(({sampling_seed} + k))
    mapfile -t ARGS < <(sed -e "s#\\$EXPORT_DIR#$EXPORT_DIR#g" -e "s#\\$SAMPLING_SEED#$SAMPLING_SEED#g" \\
        -e "s#\\$DATA_SEED#$DATA_SEED#g" -e "s#\\$SEED#$SEED#g" "$EXPORT_DIR/launch/overrides.txt")
    python3 -m verl.trainer.main_ppo "${{ARGS[@]}}" "$@"
done
"""


def fill(override: str, export_dir, seed: int, profile: Profile) -> str:
    """One override line with launch.sh's substitutions (the verl checks use this too)."""
    return (
        override.replace("$EXPORT_DIR", str(export_dir))
        .replace("$SAMPLING_SEED", str(profile.seeds.ppo_sampling + seed))
        .replace("$DATA_SEED", str(profile.seeds.data_order + seed))
        .replace("$SEED", str(seed))
    )


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
