"""The lab's hyperparameters as verl's (`rlhf export-verl`): one row per SPEC §5-§6 hyperparameter
with the lab's value, the verl override(s) that carry it, whether it carries exactly,
approximately or not at all, and what that means; the Hydra overrides of launch/overrides.txt
built from those rows; and launch.sh, which runs verl's PPO on the hand-off once per seed."""

from __future__ import annotations

import math

from rlhf.config import Profile


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
