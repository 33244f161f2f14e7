"""Fixed vocabulary of the reports: populations, metrics, pair variants, PPO phases, stages."""

from __future__ import annotations

from rlhf.report.wording import SCORE_NAME, SCORE_SHORT
from rlhf.rubric import FINISH_REASONS

POPULATIONS = ("test", "probe_rows", "probe_contexts", "all_rows", "all_unique_contexts")
POPULATION_LABELS = {
    "test": "test prompts",
    "probe_rows": "probe rows",
    "probe_contexts": "probe contexts (one row per context)",
    "all_rows": "all rows",
    "all_unique_contexts": "all unique contexts",
}
# (metrics key, label, key in evaluation "differences" or None); labels are fixed at import time.
# A dotted key reads a nested count: "finish_reasons.eos" is metrics["finish_reasons"]["eos"].
METRICS = (
    ("rubric_success", "rubric success", "rubric_success"),
    ("recognised_share", "recognised share", None),
    ("uncertified", "UNCERTIFIED", None),
    ("relevance", "relevance", None),
    ("unsupported_certainty", "unsupported certainty (of recognised)", None),
    ("refusals", "refusals", None),
    ("without_eos", "outputs without EOS", None),
    *((f"finish_reasons.{r}", f"finish reason {r} (count)", None) for r in FINISH_REASONS),
    ("polite_formula_share", "polite formulas present (share, any prose)", None),
    ("mean_length", "mean length (tokens)", None),
    ("mean_learned_reward", f"mean {SCORE_SHORT} ({SCORE_NAME})", "learned_reward"),
    ("mean_sampled_log_ratio", "mean sampled log-ratio actor/reference", None),
)
# What each finish reason (rlhf.rubric.FINISH_REASONS, in its order) means, for the report's readers.
FINISH_LABELS = {
    "eos": "ended with EOS, its tokens plain text",
    "length": "cut at the token limit without EOS, its tokens plain text",
    "control_token": "a control token (a special or added token such as <|im_start|>) inside the answer",
    "broken_text": "byte-level tokens whose bytes are not UTF-8 (the text holds U+FFFD)",
    "out_of_vocabulary": "an id past the tokenizer's last, which no text maps to (generation never draws one)",
}
VARIANTS = {
    "0": "correct + hedge, plain vs wrong + certainty, plain",
    "1": "correct, no caution, plain vs wrong + hedge, polite",
    "2": "correct + hedge, polite vs wrong, no caution, plain",
    "3": "correct + hedge, plain vs correct + certainty, polite",
    "4": "correct, no caution, polite vs wrong + hedge, plain",
}


def metric(key: str) -> tuple:
    """The METRICS entry (key, label, differences key) of metrics key `key`."""
    return next(m for m in METRICS if m[0] == key)


PHASE_LABELS = {
    "generation": "generation (sampling, actor)",
    "reference": "reference scoring",
    "judge": "judge (learned reward)",
    "critic_values": "critic values",
    "actor_update": "actor optimisation",
    "critic_update": "critic optimisation",
    "iteration": "whole loop (all phases)",
}
# The phases in the order rlhf.ppo.PHASES times them (tests_unit/test_report.py ties the two;
# the reports need no torch, so they do not import rlhf.ppo).
PPO_PHASES = tuple(PHASE_LABELS)
STAGES = ("sft", "judge", "ppo")
STAGE_LABELS = {"sft": "SFT", "judge": "judge (reward model)", "ppo": "PPO"}

# The stage summaries of results.json (rlhf.report.results) in words: the report shows these, the
# JSON keeps its keys. A key without an entry would reach the report raw (tests_unit/test_report.py).
SUMMARY_LABELS = {
    "updates": "updates run",
    "total_updates": "updates planned",
    "epochs": "epochs",
    "first_update_loss": "loss of the first update",
    "last_update_loss": "loss of the last update",
    "peak_lr": "peak learning rate",
    "final_train_loss": "train loss, last epoch",
    "final_validation_loss": "validation loss, last epoch",
    "mean_loss_last_10_updates": "mean loss of the last 10 updates",
    "response_tokens_trained": "response tokens trained on",
    "max_grad_norm_before_clipping": "largest gradient norm (before clipping at 1)",
    "mean_accuracy_last_10_updates": "mean pair accuracy of the last 10 updates",
    "final_train_accuracy": "train pair accuracy, last epoch",
    "final_validation_accuracy": "validation pair accuracy, last epoch",
    "final_validation_ties": "validation ties, last epoch",
    "iterations": "iterations",
    "sampled_responses": "sampled responses",
    "distinct_rollout_prompts": "distinct rollout prompts",
    "actor_updates": "actor updates",
    "critic_updates": "critic updates",
    "truncations": "responses cut at the limit without EOS",
    "mean_score_first_10": f"mean {SCORE_SHORT}, first 10 iterations",
    "mean_score_last_10": f"mean {SCORE_SHORT}, last 10 iterations",
    "mean_sampled_log_ratio_first_10": "mean sampled log-ratio actor/reference, first 10 iterations",
    "mean_sampled_log_ratio_last_10": "mean sampled log-ratio actor/reference, last 10 iterations",
    "mean_response_length_first_10": "mean response length (tokens), first 10 iterations",
    "mean_response_length_last_10": "mean response length (tokens), last 10 iterations",
    "value_loss_last_10": "mean critic value loss, last 10 iterations",
    "clip_fraction_mean": "mean clip fraction, all updates",
    "peak_rss_mib": "peak resident memory (MiB)",
    "cuda_peak_allocated_mib": "peak CUDA memory allocated (MiB)",
    "cuda_peak_reserved_mib": "peak CUDA memory reserved (MiB)",
}
