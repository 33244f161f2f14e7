"""Reward designs: what PPO pays at an answer's last token, one registry entry each.

SPEC §6 pays the frozen judge's score s. The declared alternatives (SPEC §12) pay something
else there, before token_rewards adds the per-token KL penalty and the truncation penalty. A
design is one `Design` entry below: its name (the profile's `[ppo] reward_design`), the words
the report uses, its formula (a small named function whose docstring shows it), what it reads,
and the `[ppo]` keys only it reads. Every layer asks this table: the profile check (an unknown
name is refused at load), PPO (rlhf.ppo.pay gathers what `reads` names, then `paid` applies the
formula), the iterated judge's refreshes, the lab's ensemble members, the command line's
`--reward-design` choices, the frontier's arms and selection, the validation's best-of-n, and
the report. Adding a design is adding one entry (docs/code-map.md shows one worked through).

What a design may read (`reads`), per answer of a rollout of B answers:

  JUDGE            s [B]       the frozen judge's score at the last active token
  SCORE_STATISTICS μ, σ        the judge's mean and SD on SFT samples, measured once before PPO
  TRUNCATION       cut [B]     the answer was cut at the token limit without EOS
  RUBRIC           success [B] the rubric's verdict on the train prompt (reads the target: a control)
  REFRESHED_JUDGE  s [B]       the judge's score, the judge refreshed on the policy's answers (rlhf.refresh)
  JUDGES           S [k, B]    k judges' scores, S[0] = s, the others trained from their own seeds

The judge's own score s is computed and recorded under every design, whatever it pays.

This module imports no torch (the command line and the profile check read it); the formulas
use the tensors' own methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

JUDGE = "judge"
SCORE_STATISTICS = "score statistics"
TRUNCATION = "truncation"
RUBRIC = "oracle rubric"
REFRESHED_JUDGE = "refreshed judge"
JUDGES = "judges"
READS = (JUDGE, SCORE_STATISTICS, TRUNCATION, RUBRIC, REFRESHED_JUDGE, JUDGES)


# ------------------------------------------------------------------------- the formulas


def judge_score(score: Tensor) -> Tensor:
    """``s``: the judge's score itself (SPEC §6; the iterated judge's as last refreshed). [B] -> [B]."""
    return score


def standardised_score(score: Tensor, score_mean: float, score_sd: float) -> Tensor:
    """``(s - score_mean) / score_sd``: the judge standardised once, on SFT samples, before PPO
    (SPEC §12 (ii)). [B] -> [B]."""
    return (score - score_mean) / score_sd


def eos_less_replaced_score(score: Tensor, truncated: Tensor) -> Tensor:
    """``0 if truncated else s``: an answer cut without EOS gets no score, so the truncation
    penalty replaces it (SPEC §12 (iii)). [B], [B] -> [B]."""
    from rlhf.masks import as_bool_mask  # imported here: the profile check reads this module without torch

    return score.masked_fill(as_bool_mask(truncated), 0.0)


def oracle_score(success: Tensor, score: Tensor) -> Tensor:
    """``success``: the rubric's verdict on the train prompt, 1 or 0, in place of the judge's
    score (SPEC §12 (iv)). [B] -> [B] in the score's dtype."""
    if tuple(success.shape) != tuple(score.shape):
        raise ValueError(f"the oracle design needs one rubric success per response, got {tuple(success.shape)}")
    return success.to(score.dtype)


def ensemble_mean(member_scores: Tensor) -> Tensor:
    """``mean_k s_k``: the members' mean score. Shapes: member_scores [k, B] -> [B]."""
    return member_scores.mean(dim=0)


def ensemble_min(member_scores: Tensor) -> Tensor:
    """``min_k s_k``: the worst case over the members (Coste et al. 2023). [k, B] -> [B]."""
    return member_scores.min(dim=0).values


def ensemble_uncertainty(member_scores: Tensor, lam: float) -> Tensor:
    """``mean_k s_k - lam * sd_k s_k``: the mean, less lam times the members' disagreement
    (uncertainty-weighted; sd over the k members with divisor k). [k, B] -> [B]."""
    return member_scores.mean(dim=0) - lam * member_scores.std(dim=0, correction=0)


# ------------------------------------------------------------------------- what a design reads


@dataclass(frozen=True)
class Inputs:
    """What a design may read of one rollout's B answers (None where nobody gathered it)."""

    score: Tensor  # [B] the judge's score (member 0 of an ensemble; the refreshed judge's when it learns)
    truncated: Tensor  # [B] bool: cut at the token limit without EOS
    success: Tensor | None = None  # [B] the rubric's success on the train prompt (RUBRIC)
    member_scores: Tensor | None = None  # [k, B] every judge's score, member 0 = score (JUDGES)
    score_mean: float = 0.0  # μ (SCORE_STATISTICS)
    score_sd: float = 1.0  # σ (SCORE_STATISTICS)
    ensemble_lambda: float = 1.0  # the uncertainty design's λ


def check_members(member_scores: Tensor | None, score: Tensor, design: str) -> None:
    """An ensemble design reads every member's score of every response, [k, B], member 0 the
    lab's judge (whose scores are `score`)."""
    if member_scores is None or member_scores.dim() != 2 or member_scores.shape[1:] != score.shape:
        raise ValueError(
            f"the {design} design needs every member's score of every response, [k, B], got "
            f"{None if member_scores is None else tuple(member_scores.shape)}"
        )
    if not member_scores[0].equal(score):
        raise ValueError(f"the {design} design: member 0 is the lab's judge, whose scores are `score`")


def _members(x: Inputs, design: str) -> Tensor:
    check_members(x.member_scores, x.score, design)
    assert x.member_scores is not None
    return x.member_scores


def _success(x: Inputs) -> Tensor:
    if x.success is None:
        raise ValueError("the oracle design needs one rubric success per response, got None")
    return x.success


# ------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Design:
    """One reward design: the profile's `[ppo] reward_design` value and everything it implies."""

    name: str
    label: str  # the report's words for what the last token receives
    spec: str  # where the SPEC declares it
    pay: Callable[[Inputs], Tensor]  # its formula applied to what it reads
    reads: tuple[str, ...]  # among READS
    keys: tuple[str, ...] = ()  # the [ppo] keys only this design reads (others must keep their defaults)
    min_ensemble: int = 0  # an ensemble needs at least this many judges (ppo.ensemble_size)

    @property
    def ensemble(self) -> bool:
        """Trains k - 1 more judges from their own seeds before PPO (lab's judge-1/ .. judge-(k-1)/)."""
        return JUDGES in self.reads

    @property
    def refreshes_judge(self) -> bool:
        """The judge learns during PPO (rlhf.refresh): its fingerprint changes, its state is saved."""
        return REFRESHED_JUDGE in self.reads

    @property
    def reads_target(self) -> bool:
        """A control that reads the rubric's target: shows the room, is never a candidate answer."""
        return RUBRIC in self.reads

    @property
    def needs_actions(self) -> bool:
        """Reads each train family's action from the train pairs (the rubric, or the refresh's labeller)."""
        return self.reads_target or self.refreshes_judge

    @property
    def measured_before_ppo(self) -> bool:
        """Needs numbers measured on SFT samples first (μ, σ): set by a study, not offered by `rlhf lab`."""
        return SCORE_STATISTICS in self.reads


REFRESH_KEYS = ("refresh_every", "refresh_prompts", "refresh_updates", "refresh_lr_ratio")

DESIGNS: dict[str, Design] = {
    d.name: d
    for d in (
        Design("judge", "the frozen judge's score (SPEC §6)", "§6", lambda x: judge_score(x.score), reads=(JUDGE,)),
        Design(
            "standardised-judge",
            "the frozen judge's score, standardised once before PPO",
            "§12 (ii)",
            lambda x: standardised_score(x.score, x.score_mean, x.score_sd),
            reads=(JUDGE, SCORE_STATISTICS),
            keys=("score_mean", "score_sd"),
        ),
        Design(
            "eos-less-replaced",
            "the frozen judge's score, or the truncation penalty alone for an answer cut without EOS",
            "§12 (iii)",
            lambda x: eos_less_replaced_score(x.score, x.truncated),
            reads=(JUDGE, TRUNCATION),
        ),
        Design(
            "oracle",
            "the rubric's success on the train prompt (a control that reads the target)",
            "§12 (iv)",
            lambda x: oracle_score(_success(x), x.score),
            reads=(RUBRIC,),
        ),
        Design(
            "iterated-judge",
            "the judge's score, the judge refreshed on the policy's own answers during PPO",
            "§12",
            lambda x: judge_score(x.score),
            reads=(REFRESHED_JUDGE,),
            keys=REFRESH_KEYS,
        ),
        Design(
            "ensemble-mean",
            "the mean score of a judge ensemble",
            "§12",
            lambda x: ensemble_mean(_members(x, "ensemble-mean")),
            reads=(JUDGES,),
            keys=("ensemble_size",),
            min_ensemble=2,
        ),
        Design(
            "ensemble-min",
            "the lowest score of a judge ensemble (worst case)",
            "§12",
            lambda x: ensemble_min(_members(x, "ensemble-min")),
            reads=(JUDGES,),
            keys=("ensemble_size",),
            min_ensemble=2,
        ),
        Design(
            "ensemble-uncertainty",
            "the mean score of a judge ensemble less lambda times its members' SD",
            "§12",
            lambda x: ensemble_uncertainty(_members(x, "ensemble-uncertainty"), x.ensemble_lambda),
            reads=(JUDGES,),
            keys=("ensemble_size", "ensemble_lambda"),
            min_ensemble=2,
        ),
    )
}
DEFAULT = "judge"  # SPEC §6
NAMES = tuple(DESIGNS)
LAB_OPTIONS = tuple(name for name, d in DESIGNS.items() if not d.measured_before_ppo)
ENSEMBLES = tuple(name for name, d in DESIGNS.items() if d.ensemble)


def design(name: str) -> Design:
    """The registered design called `name`; an unknown name is refused, naming the known ones."""
    if name not in DESIGNS:
        raise ValueError(f"unknown reward design {name!r}: the registered designs are {', '.join(NAMES)}")
    return DESIGNS[name]


def label(name: str) -> str:
    """The report's words for a design (a name from an older record is shown as itself)."""
    return DESIGNS[name].label if name in DESIGNS else name


def paid(name: str, inputs: Inputs) -> Tensor:
    """The score paid at an episode's last token under design `name`, before token_rewards adds
    the truncation penalty: the one scoring path of PPO's rollouts and the validation's
    best-of-n. ``judge`` returns ``inputs.score`` itself."""
    return design(name).pay(inputs)


def profile_errors(cfg) -> list[str]:
    """What the `[ppo]` table `cfg` gets wrong about its reward design: an unknown name, a key
    of another design set away from its default (a setting never read silently), an ensemble
    too small. Empty when it is right."""
    if cfg.reward_design not in DESIGNS:
        return [f"reward_design must be one of {', '.join(NAMES)}, not {cfg.reward_design!r}"]
    d = DESIGNS[cfg.reward_design]
    errors = []
    defaults = {f.name: f.default for f in cfg.__dataclass_fields__.values()}
    owners: dict[str, list[str]] = {}
    for other in DESIGNS.values():
        for key in other.keys:
            owners.setdefault(key, []).append(other.name)
    for key, names in owners.items():
        if key not in d.keys and getattr(cfg, key) != defaults[key]:
            errors.append(
                f"{key} applies to reward_design {' and '.join(repr(n) for n in names)} only, not "
                f"{cfg.reward_design!r}: a setting is never ignored silently"
            )
    if d.min_ensemble and cfg.ensemble_size < d.min_ensemble:
        errors.append(
            f"reward_design {cfg.reward_design!r} needs ensemble_size at least {d.min_ensemble}, "
            f"not {cfg.ensemble_size}"
        )
    return errors
