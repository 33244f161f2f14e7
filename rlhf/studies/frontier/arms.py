"""The frontier's arms and settings: what each PPO arm pays at an answer's end and at which KL
coefficient, and what the study measures (both part of the study's identity).

Arms (ARMS): the SPEC's §6 as written (raw KL coefficient 0.02); §6 with the KL coefficient
beta = c * sigma for c in GRID (c: beta in units of the judge's spread, what beta would be on a
judge of SD 1); declared reward designs at the SPEC's 0.02 (`ppo.reward_design`,
rlhf.designs): the judge standardised once on train-prompt SFT samples, an answer
without EOS paid the penalty instead of the score, the oracle control (the rubric's success on
the train prompt; a control, never selected); and the iterated judge and the worst-case judge
ensemble, at 0.02 and at the grid's best c (`Arm.c_from_grid`: chosen on validation once the
grid arms are measured, rlhf.studies.frontier.selection.grid_choice). MORE_ARMS holds declared
arms outside the default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import cast

from rlhf import designs
from rlhf.studies import StudyError

METHODS = ("ppo", "dpo", "grpo")
METHOD_SETTINGS = {"dpo": ("beta", "epochs"), "grpo": ("group_size", "beta")}  # what each method may declare


def check_method(method: str, settings: dict) -> None:
    """A known method, declaring only its own settings."""
    if method not in METHODS:
        raise StudyError(f"an arm's method is one of {', '.join(METHODS)}, not {method!r}")
    unknown = sorted(set(settings) - set(METHOD_SETTINGS.get(method, ())))
    if unknown:
        allowed = ", ".join(METHOD_SETTINGS.get(method, ())) or "nothing"
        raise StudyError(f"a {method} arm declares {allowed}, not {', '.join(unknown)}")


SPEC_KL = 0.02
GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BON_NS = (1, 2, 4, 8, 16)
KL_SAMPLES = 2


@dataclass(frozen=True)
class Arm:
    """One PPO arm: its reward design and its KL coefficient, raw or in units of sigma."""

    name: str
    design: str  # ppo.reward_design
    c: float | None = None  # beta = c * sigma (sigma: this seed's judge spread on validation)
    raw: float | None = None  # beta as written
    actor_lr: float | None = None  # the actor's peak learning rate, when not the profile's
    ppo: tuple[tuple[str, object], ...] = ()  # other [ppo] keys of the design (refresh_every, ensemble_size, ...)
    c_from_grid: bool = False  # c is the grid's best (grid_choice), known once the grid's arms are measured
    ppo_offset: int | None = None  # [seeds] ppo_offset: PPO's draws for a nested study's PPO seed (None: none)
    # The training method (METHODS): PPO, or DPO or GRPO (rlhf.studies.frontier.methods), whose own
    # settings (METHOD_SETTINGS) are declared here; their profile's [ppo] KL coefficient is not read.
    method: str = "ppo"
    method_settings: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        check_method(self.method, dict(self.method_settings))

    def kl_coef(self, sigma: float) -> float:
        if self.raw is not None:
            return self.raw
        if self.c is None:
            raise ValueError(
                f"arm {self.name}: "
                + ("its c comes from the grid's best (grid_choice)" if self.c_from_grid else "no KL coefficient")
            )
        return self.c * sigma

    def changes(self, spread: dict) -> dict:
        """{(table, key): value} of this arm's profile, from the seed's measured spreads."""
        out: dict = {
            ("ppo", "kl_coef"): self.kl_coef(spread["validation"]["sd"]),
            ("ppo", "reward_design"): self.design,
        }
        if designs.design(self.design).measured_before_ppo:  # the judge's mean and SD on train-prompt samples
            out[("ppo", "score_mean")] = spread["train"]["mean"]
            out[("ppo", "score_sd")] = spread["train"]["sd"]
        if self.actor_lr is not None:
            out[("ppo", "actor_lr")] = self.actor_lr
        out.update({("ppo", key): value for key, value in self.ppo})
        if self.ppo_offset is not None:
            out[("seeds", "ppo_offset")] = self.ppo_offset
        return out

    def describe(self) -> str:
        beta = f"beta = {self.c} sigma" if self.c is not None else f"beta = {self.raw} (raw)"
        if self.c_from_grid:
            beta = "beta = c sigma at the grid's best c" + ("" if self.c is None else f" ({self.c})")
        lr = "" if self.actor_lr is None else f", actor learning rate {self.actor_lr:g}"
        offset = "" if self.ppo_offset is None else f", PPO seeds + {self.ppo_offset}"
        if self.method != "ppo":
            own = "".join(f", {key} {value}" for key, value in self.method_settings)
            paid = ", paid by the judge" if self.method == "grpo" else ", from the judge's train pairs"
            return f"{self.method.upper()}{paid}{own}{offset}"
        return f"{self.design}, {beta}{lr}" + "".join(f", {key} {value}" for key, value in self.ppo) + offset


def grid_name(c: float) -> str:
    """A grid arm's name: c and its coefficient to 6 significant digits."""
    return f"c{c:g}"


def parse_grid(text: str | None) -> tuple[float, ...]:
    """`--grid C1,C2,...` as coefficients in units of sigma (GRID when absent), checked by check_grid."""
    if text is None:
        return GRID
    grid = []
    for part in text.split(","):
        try:
            grid.append(float(part))
        except ValueError:
            raise StudyError(f"--grid takes comma-separated numbers (c1,c2,...), not {part.strip()!r}") from None
    return check_grid(tuple(grid))


def check_grid(grid: tuple[float, ...]) -> tuple[float, ...]:
    """Each c finite and >= 0 (beta = c sigma is a penalty, never a bonus for leaving SFT), and
    each arm name distinct (two c's that print alike would share one arm's folder)."""
    for c in grid:
        if not (math.isfinite(c) and c >= 0):
            raise StudyError(f"--grid values must be finite numbers >= 0 (beta = c sigma), not {c}")
    names = [grid_name(c) for c in grid]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StudyError(f"--grid values must be distinct: {', '.join(twice)} given more than once")
    return grid


def default_arms(grid=GRID) -> tuple[Arm, ...]:
    """The study's arms (module docstring) with `grid` (checked) as its coefficient grid."""
    check_grid(grid)
    return (
        Arm("spec-default", "judge", raw=SPEC_KL),
        *(Arm(grid_name(c), "judge", c=c) for c in grid),
        Arm("standardised-judge", "standardised-judge", raw=SPEC_KL),
        Arm("eos-less-replaced", "eos-less-replaced", raw=SPEC_KL),
        Arm("oracle", "oracle", raw=SPEC_KL),
        # The two designs that keep the judge in distribution, at the SPEC's coefficient and at the
        # grid's best (the best c of the plain judge, chosen on validation before these run).
        Arm("iterated-judge", "iterated-judge", raw=SPEC_KL),
        Arm("iterated-judge-cbest", "iterated-judge", c_from_grid=True),
        Arm("ensemble-min", "ensemble-min", raw=SPEC_KL),
        Arm("ensemble-min-cbest", "ensemble-min", c_from_grid=True),
    )


# Declared arms outside the default (Settings(arms=...)), left out to keep the study's time.
MORE_ARMS = (
    Arm("c0.005", "judge", c=0.005),
    # The oracle at a tenth of the embedded profile's actor learning rate (1e-4; the SPEC's is 5e-6).
    Arm("oracle-lr1e-5", "oracle", raw=SPEC_KL, actor_lr=1e-5),
    Arm("ensemble-mean", "ensemble-mean", raw=SPEC_KL),
    Arm("ensemble-uncertainty", "ensemble-uncertainty", raw=SPEC_KL),
)


ARMS = default_arms()


OPTIONAL = {"ppo_offset": None, "method": "ppo", "method_settings": ()}  # recorded only when not these

NEEDS_GRID = "arms that take c from the grid's best need grid arms (the plain judge at beta = c sigma)"


@dataclass(frozen=True)
class Settings:
    """What the measurements use (part of the study's identity)."""

    arms: tuple[Arm, ...] = ARMS
    bon_ns: tuple[int, ...] = BON_NS
    kl_samples: int = KL_SAMPLES
    # Best-of-n ranked by each of these ensemble rewards too, on the same draws (with ensemble arms:
    # their members; none without).
    bon_ensembles: tuple[str, ...] = designs.ENSEMBLES

    def __post_init__(self):
        names = [a.name for a in self.arms]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise StudyError(f"every arm needs a name of its own (its folder): {', '.join(twice)} used twice")
        if not self.bon_ns or self.bon_ns[0] != 1 or list(self.bon_ns) != sorted(set(self.bon_ns)):
            raise StudyError(f"best-of-n's n must rise from 1 (its gains are over best-of-1), not {self.bon_ns}")
        if any(a.c_from_grid for a in self.arms) and not grid_arms(self.arms):
            raise StudyError(NEEDS_GRID)

    def record(self) -> dict:
        return {
            # ppo_offset and the method only where not the default: the studies recorded before they
            # existed keep their identity
            "arms": [
                {
                    **{k: v for k, v in dataclasses.asdict(a).items() if k not in OPTIONAL or v != OPTIONAL[k]},
                    "ppo": [list(kv) for kv in a.ppo],
                    **({"method_settings": [list(kv) for kv in a.method_settings]} if a.method_settings else {}),
                }
                for a in self.arms
            ],
            "bon_ns": list(self.bon_ns),
            "kl_samples_per_prompt": self.kl_samples,
            "bon_ensembles": list(self.bon_ensembles),
        }

    def ensemble_arm(self) -> Arm | None:
        """The first ensemble arm: its members and lambda rank the ensemble's best-of-n."""
        return next((a for a in self.arms if designs.design(a.design).ensemble), None)


def grid_arms(arms) -> list[Arm]:
    """The coefficient grid: the plain judge's arms at beta = c sigma."""
    return [a for a in arms if a.design == designs.DEFAULT and a.c is not None and not a.c_from_grid]


def resolved(arms, choice: dict | None) -> tuple[Arm, ...]:
    """`arms` with the grid's best c written into those that take it."""
    if any(a.c_from_grid for a in arms) and choice is None:
        raise StudyError(NEEDS_GRID)
    return tuple(dataclasses.replace(a, c=cast(dict, choice)["c"]) if a.c_from_grid else a for a in arms)


def settings_of(identity: dict) -> Settings:
    """The Settings a study's identity records."""
    rec = identity["settings"]
    return Settings(
        arms=tuple(
            Arm(**{**a, "ppo": _pairs(a.get("ppo", ())), "method_settings": _pairs(a.get("method_settings", ()))})
            for a in rec["arms"]
        ),
        bon_ns=tuple(rec["bon_ns"]),
        kl_samples=rec["kl_samples_per_prompt"],
        bon_ensembles=tuple(rec.get("bon_ensembles", ())),  # a study made before they were measured: none
    )


def _pairs(rows) -> tuple[tuple[str, object], ...]:
    return tuple((str(k), v) for k, v in rows)
