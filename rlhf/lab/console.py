"""What the lab says while it runs: the progress bar, one line per epoch and every tenth PPO
iteration, and each over-optimisation warning once, in iteration order (with the record of the
warnings that fired, ppo/warnings.json)."""

from __future__ import annotations

import sys

from tqdm import tqdm

from rlhf import signals
from rlhf.io import sha256_file


def progress_bar(desc: str, total: int):
    bar = tqdm(
        total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True, disable=not sys.stderr.isatty()
    )

    def update(step, _total, loss):
        bar.n = step
        bar.set_postfix_str(f"loss {loss:.4f}" if isinstance(loss, float) else "")
        bar.refresh()

    return bar, update


def print_line(line: str) -> None:
    print(line, flush=True)


def bar_line(bar, line: str) -> None:
    """A progress line: above the bar on a terminal, else printed."""
    if sys.stderr.isatty():
        bar.write(line)
    else:
        print_line(line)


PRINT_EVERY = 10  # PPO prints every 10th iteration (and the last), on a terminal or to a file


def ppo_progress(bar, tick, *, quiet: bool = False):
    """The progress callback of a PPO leg: the bar, and a line every PRINT_EVERY-th iteration
    (none in a quiet leg)."""

    def progress(it, total, history, _measured):
        rec = history["iterations"][-1]
        tick(it, total, rec["policy_loss"][-1])
        if quiet or not (it % PRINT_EVERY == 0 or it == total):
            return
        line = (
            f"ppo iteration {it}: learned reward {rec['mean_score']:+.3f}  sampled log-ratio per token "
            f"{rec['mean_sampled_log_ratio']:+.4f}  value loss {rec['value_loss'][-1]:.4f}  "
            f"clip fraction {rec['clip_fraction'][-1]:.3f}  length {rec['response_length']:.1f}  "
            f"truncations {rec['truncations']}"
        )
        bar_line(bar, line)

    return progress


def warning_watch(cfg, announced: set[str] | None = None, say=print_line):
    """watch(history) for a PPO leg: says each frozen warning rule the first time it fires
    (rlhf.signals), in the order of the iterations where they fired (numbered from 1, as the
    console's iteration lines and ppo/warnings.json count), and never a signal already
    in `announced` (shared by a command's legs; `say` None: silent); True stops PPO when
    `cfg.stop_on_warning` names that signal (or any), whether or not it is said."""
    rules, window = signals.frozen_rules()
    announced = set() if announced is None else announced

    def watch(history: dict) -> bool:
        fired = signals.fired_in_order(history, rules, window)
        for index, rule in fired:
            if say is not None and rule.signal not in announced:
                announced.add(rule.signal)
                say(
                    f"warning: over-optimisation signal {rule.signal} fired at iteration {index + 1} "
                    f"({rule.describe()})" + ("; PPO stops here (stop_on_warning)" if stops_ppo(cfg, rule) else "")
                )
        return any(stops_ppo(cfg, rule) for _, rule in fired)

    return watch


def stops_ppo(cfg, rule) -> bool:
    """Whether `rule`, once fired, stops PPO: stop_on_warning set, and its signal named in
    stop_signals (or none named)."""
    return bool(cfg.stop_on_warning and (not cfg.stop_signals or rule.signal in cfg.stop_signals))


def fired_warnings(history: dict, cfg) -> dict:
    """ppo/warnings.json: every frozen warning rule that fired over the run's PPO history, in the
    order of the iterations where they fired (numbered from 1: the iteration after which it fired,
    as the console counts), and whether PPO stopped there; with the rules file's hash and window."""
    rules, window = signals.frozen_rules()
    done = len(history["iterations"])
    return {
        "rules_file": signals.RULES_FILE.name,
        "rules_sha256": sha256_file(signals.RULES_FILE),
        "window": window,
        "fired": [
            {
                "signal": rule.signal,
                "iteration": index + 1,
                "rule": rule.describe(),
                # PPO stops after the iteration where a stopping rule fires, short of its budget
                "stopped_ppo": stops_ppo(cfg, rule) and index + 1 == done < cfg.iterations,
            }
            for index, rule in signals.fired_in_order(history, rules, window)
        ],
    }
