"""Reward of the rlhf lab for verl 0.9.1 (copied into a hand-off by `rlhf export-verl`).

Self-contained: imports nothing from `rlhf`. It reads `reward_config.json` and the vendored
rubric `lab_rubric.py` from its own folder, and the judge from `../models/judge`.

* `LabJudgeRewardManager` (verl: reward.reward_manager.source=importlib) pays, once per
  response, the frozen judge's score (read at the last response token, EOS included, plus the
  judge head's bias) and the truncation penalty (-1) when the response was cut without EOS.
  verl places that number at the last valid response token (`assemble_rm_scores`); with
  `algorithm.use_kl_in_reward` verl subtracts kl_coef * (logp_old - logp_ref) on every token:
  the lab's `token_rewards`.
* `compute_score(data_source, solution_str, ground_truth, extra_info)` is the rubric, for
  metrics on the held-out rows (ground truth = the expected action). It never enters the
  reward: RL sees prompts only. It needs `extra_info["finish_reason"]` (one of the rubric's
  FINISH_REASONS: "eos", "length", "control_token", "broken_text", "out_of_vocabulary", named by
  `decode_response` from the token ids): decoded text alone cannot say whether the answer ended
  with EOS, and a truncated answer or one with a token fault is never a rubric success.

Every response, training rows included, also reports one indicator per finish reason
(`finish_eos`, `finish_length`, `finish_control_token`, `finish_broken_text`,
`finish_out_of_vocabulary`: 1.0 for its own reason, else 0.0), so verl's reward metrics show the
share of each.

Every row of a batch returns the same keys (verl takes the keys of the first row); rubric
fields are NaN on rows without ground truth (the training prompts).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUBRIC_FIELDS = ("rubric_success", "recognized", "relevant", "unsupported_certainty", "polite", "refusal")

try:  # the base class exists only where verl is installed; scoring itself needs only torch/transformers
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
except ImportError:  # pragma: no cover - exercised in the lab's own environment
    RewardManagerBase = object

_CACHE: dict = {}


def reward_config() -> dict:
    if "config" not in _CACHE:
        _CACHE["config"] = json.loads((HERE / "reward_config.json").read_text())
    return _CACHE["config"]


def rubric():
    """The vendored rubric module (lab_rubric.py beside this file)."""
    if "rubric" not in _CACHE:
        spec = importlib.util.spec_from_file_location("lab_rubric", HERE / "lab_rubric.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _CACHE["rubric"] = module
    return _CACHE["rubric"]


def cut_without_eos(response_ids: list[int], eos_id: int) -> bool:
    """True when the response's last token is not EOS: cut at the limit (the truncation penalty)."""
    return not (response_ids and response_ids[-1] == eos_id)


def decode_response(tokenizer, ids: list[int], eos_id: int) -> tuple[str, str]:
    """Text and finish reason exactly as the lab decodes (rlhf.tokens.decode_response): the
    body's (ids without the final EOS) first token fault, in the precedence out_of_vocabulary
    (an id past the tokenizer) > control_token (a special or added token) > broken_text (U+FFFD:
    bytes that are not UTF-8), else "eos" or "length"."""
    ended = bool(ids) and ids[-1] == eos_id
    body = list(ids[:-1]) if ended else list(ids)
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    control = set(tokenizer.all_special_ids) | {eos_id} | {i for i, t in added.items() if getattr(t, "special", False)}
    text = tokenizer.decode([i for i in body if 0 <= i < len(tokenizer)])
    if any(i < 0 or i >= len(tokenizer) for i in body):
        return text, "out_of_vocabulary"
    if not control.isdisjoint(body):
        return text, "control_token"
    if "\ufffd" in text:
        return text, "broken_text"
    return text, ("eos" if ended else "length")


def finish_indicators(reason: str) -> dict[str, float]:
    """{"finish_<reason>": 1.0 for `reason`, 0.0 for every other reason of the rubric's
    FINISH_REASONS}: their means over a batch are the share of each reason."""
    reasons = rubric().FINISH_REASONS
    if reason not in reasons:
        raise ValueError(f"unknown finish reason {reason!r}; the reasons are {reasons}")
    return {f"finish_{r}": float(r == reason) for r in reasons}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """The lab's rubric on one held-out answer: score 1.0 for a rubric success, else 0.0."""
    if ground_truth in (None, ""):
        raise ValueError(
            f"{data_source}: no ground truth (expected action) on this row; the rubric is for "
            f"the held-out rows only (training rows carry no label)"
        )
    reason = (extra_info or {}).get("finish_reason")
    if reason is None:
        raise ValueError(
            f"compute_score needs extra_info['finish_reason'] (one of {rubric().FINISH_REASONS}): "
            "use LabJudgeRewardManager, which sets it from the token ids"
        )
    result = rubric().evaluate(solution_str, reason, int(ground_truth))
    out = {k: _number(result[k]) for k in RUBRIC_FIELDS}
    out["score"] = out["rubric_success"]
    return out


def _number(value) -> float:
    return math.nan if value is None else float(value)


class JudgeScorer:
    """The exported judge: backbone of models/judge, its score head, plus the head's bias."""

    def __init__(self, judge_dir: Path, bias: float, device: str | None = None):
        import torch
        from transformers import Qwen2ForSequenceClassification

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = Qwen2ForSequenceClassification.from_pretrained(str(judge_dir), dtype=torch.float32)
        self.model.to(self.device).eval()  # type: ignore[arg-type]  # transformers' wrapped .to: its stub wants the model
        self.bias = bias

    def score(self, prompt_ids: list[int], response_ids: list[int]) -> float:
        """Judge score of one (prompt, response) pair, read at the last response token (the
        lab's pooling; one unpadded row, so no PAD can be mistaken for the end)."""
        torch = self.torch
        ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=self.device)
        with torch.no_grad():
            hidden = self.model.model(input_ids=ids, use_cache=False).last_hidden_state  # [1, T, H]
            return float(self.model.score(hidden[:, -1].float())[0, 0]) + self.bias


def judge_scorer() -> JudgeScorer:
    if "judge" not in _CACHE:
        cfg = reward_config()
        _CACHE["judge"] = JudgeScorer((HERE / cfg["judge_dir"]).resolve(), cfg["judge_bias"])
    return _CACHE["judge"]


def lab_reward(prompt_ids: list[int], response_ids: list[int]) -> dict:
    """Judge score plus the truncation penalty for a response without EOS (one number per response)."""
    cfg = reward_config()
    truncated = cut_without_eos(response_ids, cfg["eos_id"])
    judge = judge_scorer().score(prompt_ids, response_ids)
    penalty = cfg["truncation_penalty"] if truncated else 0.0
    return {"reward": judge + penalty, "judge_score": judge, "truncated": float(truncated)}


class LabJudgeRewardManager(RewardManagerBase):
    """verl reward manager: judge score + truncation penalty, one indicator per finish reason,
    rubric fields for the held-out rows."""

    def __init__(
        self, config, tokenizer, compute_score=None, reward_router_address=None, reward_model_tokenizer=None, **kwargs
    ):
        if RewardManagerBase is not object:
            super().__init__(config, tokenizer, compute_score)
        self.tokenizer = tokenizer
        self.compute_score = compute_score or globals()["compute_score"]

    async def run_single(self, data) -> dict:
        item = data[-1:][0]
        prompts, responses = item.batch["prompts"], item.batch["responses"]
        mask = item.batch["attention_mask"]
        prompt_ids = prompts[mask[: prompts.shape[-1]].bool()].tolist()  # verl left-pads prompts
        n_valid = int(mask[prompts.shape[-1] :].sum())
        response_ids = responses[:n_valid].tolist()
        out = lab_reward(prompt_ids, response_ids)
        text, reason = decode_response(self.tokenizer, response_ids, reward_config()["eos_id"])
        info = {"judge_score": out["judge_score"], "truncated": out["truncated"], **finish_indicators(reason)}
        ground_truth = item.non_tensor_batch["reward_model"]["ground_truth"]
        if ground_truth not in (None, ""):
            extra = dict(item.non_tensor_batch.get("extra_info") or {}, finish_reason=reason)
            rubric_out = self.compute_score(item.non_tensor_batch["data_source"], text, ground_truth, extra)
            info.update({k: rubric_out[k] for k in RUBRIC_FIELDS})
        else:
            info.update({k: math.nan for k in RUBRIC_FIELDS})
        return {"reward_score": out["reward"], "reward_extra_info": info}
