"""TensorBoard event files: every stage's curves, written while it trains (docs/tensorboard.md).

Where: RUN/tensorboard/STAGE/ (sft, judge, judge-1 .., ppo, evaluation), one TensorBoard run
per stage, so `tensorboard --logdir RUN/tensorboard` shows a run's stages, and
`tensorboard --logdir STUDY` every seed and arm of a study (each is a run folder of its own).

Steps: optimizer updates for SFT and the judge (the history's `step`; an epoch's validation
numbers at the step of its last update), PPO iterations for PPO counted from 1 as the console,
the warnings and the report count them (the history's `iteration` + 1; a judge refresh at the
iteration it follows), and for the evaluation the number of PPO iterations behind the policy
evaluated (0: SFT; the last PPO iteration: PPO).

Which leg writes: a stage's series is made by the legs whose states make the run. With the
interrupt/resume protocol, the interrupted leg and the resumed one, which continue one series
at the boundary; the continuous leg, which only checks them bit for bit, writes none. Without
the protocol, the continuous leg. A leg that starts from a saved state (the boundary, a
checkpoint after a crash, `--resume`) opens its file with TensorBoard's purge step at that
state's step: TensorBoard hides whatever an earlier file holds from that step on, so a killed
run continued by a rerun shows one series, no step twice and none missing.

Every scalar is read from the history the training loop has already recorded, or from what a
PPO iteration hands its leg beside it (rlhf.ppo.Measured: the sums of the rollout's rewards and
the leg's own clock, `timing_s/`), after the update or iteration it describes: the event log
touches no tensor, generator or file the states depend on, so trained bytes are unchanged
(the golden tests run with it). Scalars are flushed after every update and iteration.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from rlhf import signals

FOLDER = "tensorboard"  # RUN/tensorboard/STAGE/
ANSWERS_SHOWN = 3  # test answers per policy in the evaluation's text summary
TIMING_GROUP = "timing_s/"  # the leg's own wall-clock seconds: not part of any JSON the run keeps


class EventFolderError(OSError):
    """The event folder of a run cannot be written; nothing was written."""


def folder_of(run, stage: str) -> Path:
    return Path(run) / FOLDER / stage


def tensorboard_command() -> str:
    """The TensorBoard command of this installation, runnable as printed without activating its
    environment: the `tensorboard` script beside this Python (relative to the current folder when
    inside it), else this Python running TensorBoard's module."""
    script = Path(sys.executable).parent / "tensorboard"
    if not script.is_file():
        return f"{sys.executable} -m tensorboard.main"
    here = Path.cwd()
    return str(script.relative_to(here)) if script.is_relative_to(here) else str(script)


def logdir_line(folder) -> str:
    """What `rlhf lab`, `rlhf seeds` and `rlhf frontier` print at start: the command that shows the curves."""
    return f"curves, live while it runs: {tensorboard_command()} --logdir {folder}"


def check_writable(run) -> None:
    """Refuse, before anything is written, a run whose event folder exists and cannot take files."""
    root = Path(run) / FOLDER
    if not root.exists():
        parent = next((p for p in root.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise EventFolderError(f"cannot write TensorBoard event files under {root}: {parent} is a file")
        return
    if not root.is_dir():
        raise EventFolderError(f"cannot write TensorBoard event files in {root}: it is a file, not a folder")
    for child in sorted(root.iterdir()):
        if not child.is_dir():  # where a stage's events go (RUN/tensorboard/STAGE/)
            raise EventFolderError(f"cannot write TensorBoard event files in {child}: it is a file, not a folder")
    probe = root / ".write-check.tmp"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise EventFolderError(f"cannot write TensorBoard event files in {root}: {err.strerror or err}") from err


def _mean(xs) -> float:
    return float(statistics.fmean(xs))


# ------------------------------------------------------------------------- names (docs/tensorboard.md)


def update_scalars(record: dict) -> dict[str, float]:
    """One SFT or judge update (history["updates"][k]) -> its scalars at step record["step"]."""
    out = {
        "train/loss": record["loss"],
        "train/learning_rate": record["lr"],
        "train/grad_norm": record["grad_norm"],
    }
    if "accuracy" in record:  # the judge: pairs ranked right in the update's batch
        out["train/accuracy"] = record["accuracy"]
    if "tokens" in record:  # SFT: active response tokens of the batch
        out["train/num_tokens"] = record["tokens"]
    return out


def epoch_scalars(record: dict) -> dict[str, float]:
    """One SFT or judge epoch (history["epochs"][e]) -> its scalars, at the step of its last update."""
    out = {"train/epoch_loss": record["train_loss"]}
    if "validation_loss" in record:  # a long SFT schedule records it on some epochs only (rlhf.sft.validates)
        out["eval/loss"] = record["validation_loss"]
    if "validation_accuracy" in record:
        out["train/epoch_accuracy"] = record["train_accuracy"]
        out["eval/accuracy"] = record["validation_accuracy"]
    return out


def iteration_scalars(record: dict) -> dict[str, float]:
    """One PPO iteration (history["iterations"][i]) -> its scalars, at step record["iteration"] + 1.

    objective/sampled_log_ratio is an answer's summed sampled-token log-ratio
    (sum_t log pi(a_t|s_t) - log pi_ref(a_t|s_t)), averaged over the answers: TRL's objective/kl,
    named for what it is (SPEC section 6: it is not the full-vocabulary KL). The per-token means
    and the update statistics are the history's, which rlhf.ppo_math computed. The rewards' sums
    (objective/non_score_reward, objective/rlhf_reward) are no history's: reward_scalars writes
    them from the rollout's own tensors."""
    n = len(record["scores"])
    paid = record.get("paid_scores", record["scores"])
    return {
        "objective/scores": record["mean_score"],
        "objective/paid_scores": _mean(paid),
        "objective/sampled_log_ratio": record["mean_sequence_log_ratio"],
        "objective/sampled_log_ratio_per_token": record["mean_sampled_log_ratio"],
        "objective/log_ratio_penalty_per_token": record["mean_kl_penalty"],
        "objective/scores_std": statistics.pstdev(record["scores"]),
        "policy/entropy_avg": record["entropy"],
        "policy/approxkl_avg": _mean(record["update_shift"]),
        "policy/clipfrac_avg": _mean(record["clip_fraction"]),
        "loss/policy_avg": _mean(record["policy_loss"]),
        "critic/vf_loss": _mean(record["value_loss"]),
        "critic/values/mean": record["mean_value"],
        "critic/advantages/mean": record["mean_advantage"],
        "critic/returns/mean": record["mean_return"],
        "response_length/mean": record["response_length"],
        "response_length/clip_ratio": record["truncations"] / n,
        "val/num_eos_tokens": n - record["truncations"],
        "actor/lr": record["actor_lr"][-1],
        "critic/lr": record["critic_lr"][-1],
        "actor/grad_norm": _mean(record["actor_grad_norm"]),
        "critic/grad_norm": _mean(record["critic_grad_norm"]),
    }


def reward_scalars(rewards: dict[str, float]) -> dict[str, float]:
    """An iteration's rlhf.ppo.reward_sums, from the tensors PPO learned from:
    objective/non_score_reward = mean_b sum_t -beta * (logp_old - logp_ref)[b, t] (TRL's name);
    objective/rlhf_reward = mean_b sum_t r[b, t], the paid score (the design's), the truncation
    penalty of an answer cut without EOS and the penalty."""
    return {f"objective/{name}": value for name, value in rewards.items()}


def signal_scalars(series: dict[str, list], i: int) -> dict[str, float]:
    """The over-optimisation signals (rlhf.signals, docs/signals.md) defined at iteration i."""
    return {f"signals/{name}": values[i] for name, values in series.items() if values[i] is not None}


def refresh_scalars(record: dict) -> dict[str, float]:
    """One judge refresh of the iterated judge (history["refreshes"][r]), at the iteration it follows."""
    out = {"judge_refresh/new_pairs": record["new_pairs"], "judge_refresh/pairs_so_far": record["pairs_so_far"]}
    for key in ("accuracy_before", "accuracy_after"):
        if record[key] is not None:
            out[f"judge_refresh/{key}"] = record[key]
    return out


def evaluation_scalars(metrics: dict) -> dict[str, float]:
    """One policy's held-out metrics (evaluation results' policies[name]["metrics"]): per population."""
    out = {}
    for population, m in metrics.items():
        n = m["n_rows"]
        out[f"eval/{population}/rubric_success"] = m["rubric_success"]
        out[f"eval/{population}/uncertified_rate"] = m["uncertified"] / n
        out[f"eval/{population}/truncation_rate"] = m["without_eos"] / n
        for reason, count in m["finish_reasons"].items():  # one rate per rlhf.rubric.FINISH_REASONS
            out[f"eval/{population}/finish_{reason}_rate"] = count / n
        out[f"eval/{population}/learned_reward"] = m["mean_learned_reward"]
        out[f"eval/{population}/response_length"] = m["mean_length"]
    return out


def answers_text(name: str, rows: list[dict]) -> str:
    """The first test answers of a policy as a Markdown table (TensorBoard's text tab)."""
    shown = [r for r in rows if r["population"] == "test"][:ANSWERS_SHOWN]
    lines = [
        f"**{name}**, first {len(shown)} test answers",
        "",
        "| prompt | answer | finish reason | rubric success |",
        "|---|---|---|---|",
    ]
    for r in shown:
        cell = (r["response"] or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['document_id']} | {cell} | {r['finish_reason']} | {r['rubric']['rubric_success']} |")
    return "\n".join(lines)


def validation_scalars(m: dict) -> dict[str, float]:
    """One checkpoint measured on the validation prompts by the frontier study (rlhf.studies.validation)."""
    n = m["n"]
    return {
        "validation/rubric_success": m["gold"],
        "validation/judge_score": m["proxy"],
        "validation/kl_from_sft": m["kl"],
        "validation/sqrt_kl_from_sft": m["d"],
        "validation/truncation_rate": m["truncations"] / n,
        "validation/uncertified_rate": m["uncertified"] / n,
    }


# ------------------------------------------------------------------------- the writers


def _after_the_last_file(folder: Path) -> None:
    """Wait, if need be, for the clock's next second: TensorBoard reads a folder's event files in
    the order of their names (events.out.tfevents.SECONDS.HOST.PID.N), so a new file must not
    share the second of an older one (N could then sort it first, before what it purges)."""
    newest = max((int(p.name.split(".")[3]) for p in folder.glob("events.out.tfevents.*")), default=0)
    while int(time.time()) <= newest:
        time.sleep(0.05)


class ScalarLog:
    """One event file in RUN/tensorboard/NAME/, opened at `purge_step`: TensorBoard hides what
    earlier files of the folder hold at that step and after (a rerun continues one series)."""

    def __init__(self, run, name: str, purge_step: int):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when a run writes

        folder = folder_of(run, name)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _after_the_last_file(folder)
            self.writer = SummaryWriter(str(folder), purge_step=purge_step, flush_secs=3600)
        except OSError as err:
            raise EventFolderError(f"cannot write TensorBoard event files in {folder}: {err.strerror or err}") from err

    def write(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, float(value), step)

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _start_step(state: dict | None) -> int:
    """The first step a leg writes: 0 fresh; else the saved state's updates (SFT, judge: update k is
    at step k, from 0), or its iterations + 1 (PPO: iteration k, counted from 1, is at step k)."""
    if state is None:
        return 0
    return state["iterations_done"] + 1 if "iterations_done" in state else state["step"]


class EventLog(ScalarLog):
    """The event file of one leg of one stage. `sync(step, total, history, timings)` is a
    rlhf.checkpoint.Leg progress callback: it writes what the history holds beyond what was
    written (or was in the state the leg started from), then flushes."""

    def __init__(self, run, stage: str, start_state: dict | None):
        super().__init__(run, stage, _start_step(start_state))
        self.window = signals.frozen_rules()[1]  # the window the frozen warning rules read
        history = (start_state or {}).get("history", {})
        self.done = {key: len(history.get(key, [])) for key in ("updates", "epochs", "iterations", "refreshes")}

    def _new(self, history: dict, key: str) -> list:
        rows = history.get(key, [])[self.done[key] :]
        self.done[key] += len(rows)
        return rows

    def sync(self, _step: int, _total: int, history: dict, measured=None) -> None:
        for record in self._new(history, "updates"):
            self.write(update_scalars(record), record["step"])
        for record in self._new(history, "epochs"):
            last_update = [u["step"] for u in history["updates"] if u["epoch"] == record["epoch"]][-1]
            self.write(epoch_scalars(record), last_update)
        iterations = self._new(history, "iterations")
        # PPO's step is the iteration counted from 1 (the history's index + 1), as the console, the
        # warnings and the report count it: the evaluation's PPO point then sits at the last iteration.
        for record in iterations:
            self.write(iteration_scalars(record), record["iteration"] + 1)
        if iterations:  # causal: a signal's value at an iteration never changes once it is done
            series = signals.signal_series(history, self.window, since=iterations[0]["iteration"])
            for record in iterations:
                self.write(signal_scalars(series, record["iteration"]), record["iteration"] + 1)
        if iterations and measured is not None:  # the iteration just run (rlhf.ppo.Measured)
            last = iterations[-1]["iteration"] + 1
            self.write(reward_scalars(measured.rewards), last)
            self.write({TIMING_GROUP + k: v for k, v in measured.seconds.items()}, last)
        for record in self._new(history, "refreshes"):
            self.write(refresh_scalars(record), record["after_iteration"])
        self.flush()


def write_evaluation(run, results: dict, ppo_iterations: int) -> None:
    """The held-out evaluation's scalars (SFT at step 0, PPO at its last iteration) and a few
    answers as text. Written whole each time (purge step 0), so a rerun after a crash replaces them."""
    log = ScalarLog(run, "evaluation", 0)
    try:
        for name, step in (("sft", 0), ("ppo", ppo_iterations)):
            policy = results["policies"][name]
            log.write(evaluation_scalars(policy["metrics"]), step)
            log.text("eval/answers", answers_text(name.upper(), policy["rows"]), step)
    finally:
        log.close()
