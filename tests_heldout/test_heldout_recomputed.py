"""Held-out numbers checked by an independent path.

`evaluation/results.json` publishes rates, the judge's test accuracy and bootstrap intervals.
Here every one of them is recomputed from the rows stored next to it, by code that does not
call the code that computed it:

* the rubric metrics: `rlhf.rubric.evaluate` re-run on each stored text, the expected action
  re-joined from the corpus labels, the rates counted with plain loops;
* the judge's accuracy: from the stored chosen and rejected scores, whose order is checked by
  re-scoring every pair one sequence at a time (no batch, no padding, no `reward_scores`);
* the bootstrap intervals: resampled with plain loops over the same units (families, probe
  contexts) and seed, once with the same torch generator stream (must agree exactly) and once
  with python's `random` (must agree within Monte Carlo error);
* greedy decoding: every evaluation token is the argmax of the model's logits on its prefix.

Each check runs twice: on the session's small-budget lab (conftest `small_run`: the embedded
profile with conftest.SMALL_BUDGET) and on the session's full `lab_run`.
"""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch

from conftest import SMALL_TEST_PROMPTS, first_families
from rlhf import evaluate as ev
from rlhf import rubric
from rlhf.tokens import encode_example, encode_prompt

pytestmark = pytest.mark.unit

POLICIES = ("sft", "ppo")
POPULATIONS = ("test", "probe_rows", "probe_contexts", "all_rows", "all_unique_contexts")
SPEC_EVALUATION_SEED = 349
RESAMPLES = 2000


# ------------------------------------------------------------------------------ the runs


@pytest.fixture(scope="module")
def small_lab(small_run, one_thread):
    """The session's small-budget lab (conftest `small_run`): SFT, judge and PPO, then the
    evaluation; read only."""
    return small_run


def results_of(ctx) -> dict:
    return json.loads((ctx.run / "evaluation" / "results.json").read_text())


@pytest.fixture(scope="module")
def small_results(small_lab):
    return results_of(small_lab)


@pytest.fixture(scope="module")
def lab_results(lab_run):
    return results_of(lab_run)


# ------------------------------------------------------------------------------ independent paths


def expected_action_by_id(ctx) -> dict[str, int]:
    """document_id -> gold action, read from the label files through the evaluation view."""
    view = ctx.corpus.evaluation_view()
    return {lab["document_id"]: lab["action"] for lab in view.labels("pair", "test") + view.labels("probe", "probe")}


def rows_of_population(rows: list[dict], population: str) -> list[dict]:
    """SPEC §8 populations, written out again: probe contexts keep the first row of each context."""
    test = [r for r in rows if r["population"] == "test"]
    probes = [r for r in rows if r["population"] == "probe"]
    first, seen = [], set()
    for r in probes:
        if r["family"] not in seen:
            seen.add(r["family"])
            first.append(r)
    return {
        "test": test,
        "probe_rows": probes,
        "probe_contexts": first,
        "all_rows": test + probes,
        "all_unique_contexts": test + first,
    }[population]


def plain_mean(values):
    total = 0.0
    for v in values:
        total += v
    return total / len(values) if values else None


def recount_metrics(rows: list[dict], judged: dict[str, dict], eos_id: int) -> dict:
    """The published metrics of one population, counted with plain loops from the rows and
    the re-run rubric results (`judged`: document_id -> rubric.evaluate result)."""
    n = len(rows)
    results = [judged[r["document_id"]] for r in rows]
    recognised = [j for j in results if j["recognized"] is True]
    certainty = sum(1 for j in recognised if j["unsupported_certainty"] is True)
    both_formulas = 0
    for r in rows:
        text = rubric.normalize(r["response"])
        both_formulas += rubric.POLITE_OPENING in text and rubric.POLITE_CLOSING in text
    return {
        "n_rows": n,
        "n_independent_units": len({r["family"] for r in rows}),
        "rubric_success": sum(1 for j in results if j["rubric_success"] is True) / n,
        "recognised_share": len(recognised) / n,
        "uncertified": sum(1 for j in results if j["status"] == "UNCERTIFIED"),
        "relevance": sum(1 for j in results if j["relevant"] is True) / n,
        "unsupported_certainty": certainty / len(recognised) if recognised else None,
        "refusals": sum(1 for j in results if j["refusal"] is True),
        "without_eos": sum(1 for r in rows if r["response_ids"][-1] != eos_id),
        "finish_reasons": {reason: sum(1 for r in rows if r["finish_reason"] == reason) for reason in REASONS},
        "polite_formula_share": both_formulas / n,
        "mean_length": plain_mean([len(r["response_ids"]) for r in rows]),
        "mean_learned_reward": plain_mean([r["learned_reward"] for r in rows]),
        "mean_sampled_log_ratio": plain_mean([r["sampled_log_ratio"] for r in rows]),
    }


REASONS = ("eos", "length", "control_token", "broken_text", "out_of_vocabulary")  # SPEC §3, in this order


def finish_reason_by_hand(ids: list[int], text: str, ctx) -> str:
    """The finish reason read off the ids without rlhf.tokens: a control token (the tokenizer's
    tokens flagged special) anywhere before a final EOS, else U+FFFD in the text, else the ending.
    (No id past the tokenizer: checked by the caller.)"""
    body = ids[:-1] if ids[-1] == ctx.eos_id else ids
    special = {i for i, t in ctx.tokenizer.added_tokens_decoder.items() if t.special} | {ctx.eos_id, ctx.pad_id}
    if any(i in special for i in body):
        return "control_token"
    if "\ufffd" in text:
        return "broken_text"
    return "eos" if ids[-1] == ctx.eos_id else "length"


def rerun_rubric(rows: list[dict], ctx) -> dict[str, dict]:
    """rubric.evaluate on each stored text with the action joined from the labels; also checks
    that the stored text and finish reason are what the stored token ids decode to."""
    expected = expected_action_by_id(ctx)
    limit = ctx.profile.evaluation.max_new_tokens or ctx.profile.limits.response_tokens  # the small budget cuts
    judged = {}
    for r in rows:
        ids = r["response_ids"]
        ended = ids[-1] == ctx.eos_id
        assert max(ids) < len(ctx.tokenizer), f"{r['document_id']}: an id past the tokenizer was drawn"
        assert r["response"] == ctx.tokenizer.decode(ids[:-1] if ended else ids), r["document_id"]
        assert r["finish_reason"] == finish_reason_by_hand(ids, r["response"], ctx), r["document_id"]
        assert ended or len(ids) == limit, f"{r['document_id']}: stopped early without EOS"
        assert r["expected_action"] == expected[r["document_id"]], r["document_id"]
        judged[r["document_id"]] = rubric.evaluate(r["response"], r["finish_reason"], expected[r["document_id"]])
    return judged


def check_metrics_recomputed(results: dict, ctx) -> int:
    """Every metric of every policy and population equals its recount; returns numbers checked."""
    checked = 0
    for policy in POLICIES:
        rows = results["policies"][policy]["rows"]
        judged = rerun_rubric(rows, ctx)
        for r in rows:
            assert r["rubric"] == judged[r["document_id"]], f"{policy} {r['document_id']}: stored rubric differs"
        published = results["policies"][policy]["metrics"]
        assert set(published) == set(POPULATIONS)
        for pop in POPULATIONS:
            again = recount_metrics(rows_of_population(rows, pop), judged, ctx.eos_id)
            assert set(published[pop]) == set(again), f"{policy}.{pop}: metrics without a recount"
            for key, value in again.items():
                if value is None:
                    assert published[pop][key] is None, f"{policy}.{pop}.{key}"
                else:
                    assert published[pop][key] == pytest.approx(value, rel=1e-12, abs=1e-12), f"{policy}.{pop}.{key}"
                checked += 1
    return checked


def judge_score_alone(judge, prompt_ids: list[int], response_ids: list[int]) -> float:
    """The judge's score of one (prompt, response) sequence: no batch, no padding; the hidden
    state of the last token (the response's EOS) through the scalar head."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        hidden = judge.model.model(
            input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False
        ).last_hidden_state
        return float(judge.head(hidden[0, -1].float())[0])


def check_judge_accuracy(results: dict, ctx) -> dict:
    """Accuracy, ties and per-variant accuracy recounted from the stored chosen and rejected
    scores; chosen and rejected checked against the corpus (the chosen is the rubric success)
    and against a fresh one-sequence score of each answer (a swap of the two is caught)."""
    published = results["judge_test"]
    rows = published["rows"]
    view = ctx.corpus.evaluation_view()
    units = ctx.profile.evaluation.max_units
    pairs = {p["document_id"]: p for p in first_families(view.test_pairs(), units)}
    labels = {lab["document_id"]: lab for lab in view.labels("pair", "test")}
    assert sorted(r["document_id"] for r in rows) == sorted(pairs)
    assert len(pairs) == (180 if units is None else SMALL_TEST_PROMPTS)
    hits, ties, by_variant = 0, 0, {}
    for r in rows:
        won = r["chosen_score"] > r["rejected_score"]  # a tie is a miss
        hits += won
        ties += r["chosen_score"] == r["rejected_score"]
        variant = int(r["document_id"].rsplit("-P", 1)[1])  # OHxxx-P{variant}
        assert r["variant"] == variant == labels[r["document_id"]]["variant"]
        by_variant.setdefault(str(variant), []).append(won)
    assert published["pairs"] == len(rows)
    assert published["ties"] == ties
    assert published["accuracy"] == pytest.approx(hits / len(rows), abs=1e-6)  # float32 mean in the library
    assert published["by_variant"] == pytest.approx({v: sum(h) / len(h) for v, h in by_variant.items()}, rel=1e-12)
    # Order: the corpus' chosen answer is the rubric success, the rejected one is not ...
    for doc_id, pair in pairs.items():
        action = labels[doc_id]["action"]
        assert rubric.evaluate(pair["chosen"], "eos", action)["rubric_success"], doc_id
        assert not rubric.evaluate(pair["rejected"], "eos", action)["rubric_success"], doc_id
    # ... and the stored chosen_score is the judge's score of that chosen answer, not of the rejected.
    judge = ev.evaluation_roles(ctx).judge
    separated = 0
    for r in rows:
        pair = pairs[r["document_id"]]
        p, c = encode_example(ctx.tokenizer, pair["prompt"], pair["chosen"], ctx.eos_id, ctx.profile.limits)
        _, j = encode_example(ctx.tokenizer, pair["prompt"], pair["rejected"], ctx.eos_id, ctx.profile.limits)
        chosen, rejected = judge_score_alone(judge, p, c), judge_score_alone(judge, p, j)
        assert r["chosen_score"] == pytest.approx(chosen, abs=1e-4), f"{r['document_id']}: chosen score"
        assert r["rejected_score"] == pytest.approx(rejected, abs=1e-4), f"{r['document_id']}: rejected score"
        separated += abs(chosen - rejected) > 1e-3
    assert separated >= len(rows) // 2, "too few pairs with distinct scores to see the order"
    return {"accuracy": hits / len(rows), "ties": ties, "order_checked_pairs": separated}


def unit_table(sft_rows, ppo_rows, population: str, key: str) -> dict[str, list]:
    """family -> [stratum, rows, SFT sum, PPO sum], in row order; PPO joined by document_id."""

    def value(r):
        return float(r["rubric"]["rubric_success"]) if key == "rubric_success" else float(r["learned_reward"])

    ppo = {r["document_id"]: r for r in ppo_rows}
    units = {}
    for r in rows_of_population(sft_rows, population):
        u = units.setdefault(r["family"], [r["population"], 0, 0.0, 0.0])
        u[1] += 1
        u[2] += value(r)
        u[3] += value(ppo[r["document_id"]])
    return units


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's and torch's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def resampled_interval(units: dict[str, list], draw) -> tuple[float, float]:
    """95% percentile interval of pooled PPO - SFT, resampling units with replacement inside each
    stratum (sorted by name); draw(n) returns `RESAMPLES` lists of n unit indices for a stratum."""
    count = [0.0] * RESAMPLES
    sft = [0.0] * RESAMPLES
    ppo = [0.0] * RESAMPLES
    for stratum in sorted({u[0] for u in units.values()}):
        table = [u for u in units.values() if u[0] == stratum]
        for b, picks in enumerate(draw(len(table))):
            for i in picks:
                count[b] += table[i][1]
                sft[b] += table[i][2]
                ppo[b] += table[i][3]
    diffs = [ppo[b] / count[b] - sft[b] / count[b] for b in range(RESAMPLES)]
    return percentile(diffs, 0.025), percentile(diffs, 0.975)


def check_bootstrap(results: dict, ctx) -> dict:
    """Each published interval against (a) the same unit resampling with the same torch
    generator stream (the seed and the draw order: equal to rounding) and (b) python's `random`
    with the same seed (within Monte Carlo error: a tenth of the interval's width, plus one
    lattice step for a rate)."""
    seed = ctx.profile.seeds.evaluation
    assert seed == SPEC_EVALUATION_SEED
    rows = {p: results["policies"][p]["rows"] for p in POLICIES}
    widths = {}
    for key in ("rubric_success", "learned_reward"):
        for pop in POPULATIONS:
            published = results["differences"][key][pop]
            units = unit_table(rows["sft"], rows["ppo"], pop, key)
            n = sum(u[1] for u in units.values())
            assert published["units"] == len(units), f"{key}.{pop}: {published['units']} units, not {len(units)}"
            assert published["sft"] == pytest.approx(sum(u[2] for u in units.values()) / n, rel=1e-12, abs=1e-12)
            assert published["ppo"] == pytest.approx(sum(u[3] for u in units.values()) / n, rel=1e-12, abs=1e-12)
            lo, hi = published["ci95"]

            rng = random.Random(seed)
            python_stream = resampled_interval(
                units, lambda m: [[rng.randrange(m) for _ in range(m)] for _ in range(RESAMPLES)]
            )
            # Monte Carlo error, plus for a rate one lattice step: a resampled rate moves in steps
            # of (rows of a unit) / (rows), e.g. 0.05 over the 20 probe contexts.
            step = max(u[1] for u in units.values()) / n if key == "rubric_success" else 0.0
            tol = 0.1 * (hi - lo) + step + 1e-12
            assert abs(python_stream[0] - lo) <= tol and abs(python_stream[1] - hi) <= tol, (
                f"{key}.{pop}: published {lo, hi}, python resampling {python_stream}"
            )

            g = torch.Generator().manual_seed(seed)
            same_stream = resampled_interval(units, lambda m: torch.randint(0, m, (RESAMPLES, m), generator=g).tolist())
            assert same_stream == pytest.approx((lo, hi), rel=1e-9, abs=1e-12), (
                f"{key}.{pop}: published {lo, hi}, the same torch draws give {same_stream}"
            )
            widths[f"{key}.{pop}"] = hi - lo
    return widths


def check_greedy(results: dict, ctx) -> dict:
    """Every stored evaluation token is the argmax of the policy's logits on its prefix
    (teacher-forced, one row at a time): a sampled token would not be. Ties within 1e-4 of the
    top logit (float noise between cached and full-sequence arithmetic) are counted, not failed."""
    roles = ev.evaluation_roles(ctx)
    counts = {}
    for policy in POLICIES:
        model = roles.by_kind()[policy].model
        tokens = near_ties = 0
        for r in results["policies"][policy]["rows"]:
            prompt = encode_prompt(ctx.tokenizer, r["prompt"], ctx.profile.limits, r["document_id"])
            ids = torch.tensor([prompt + r["response_ids"]])
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0].float()
            # The argmax over the tokenizer's real tokens: the embedding's padding rows past them
            # are never drawn (rlhf.scoring.real_token_logits).
            logits = logits[:, : len(ctx.tokenizer)]
            for j, token in enumerate(r["response_ids"]):
                row = logits[len(prompt) - 1 + j]
                best = int(row.argmax())
                tokens += 1
                if token != best:
                    gap = float(row[best] - row[token])
                    assert gap <= 1e-4, (
                        f"{policy} {r['document_id']} token {j}: {token} is not the argmax "
                        f"{best} (logit gap {gap:.4f}): evaluation did not decode greedily"
                    )
                    near_ties += 1
        assert near_ties <= tokens // 100
        counts[policy] = {"tokens": tokens, "near_ties": near_ties}
    return counts


# ---------------------------------------------------------------------------------- small run


def test_every_metric_is_recomputed_from_rows_by_the_rubric_small(small_results, small_lab):
    """Catches a published rate that does not follow from its rows (a wrong denominator, a
    stale rubric result, a metric added without a recount)."""
    assert check_metrics_recomputed(small_results, small_lab) > 0


def test_metric_recount_agrees_with_the_library_on_grammar_answers(small_results, small_lab):
    """The small run's policies emit no grammar text (every rate is 0), so the recount is also
    run on rows whose texts were replaced by rubric answers of every kind: catches a wrong
    certainty denominator or relevance count that all-zero rows would hide."""
    rows = copy.deepcopy(small_results["policies"]["ppo"]["rows"])
    expected = expected_action_by_id(small_lab)
    # The kinds cycle within each population that a metric reads (the probe contexts' first rows
    # apart), so that each holds every kind however few rows the budget evaluates.
    first_rows = {id(r) for r in rows_of_population(rows, "probe_contexts")}
    counters: dict[str, int] = {}
    for r in rows:
        action = expected[r["document_id"]]
        group = "first of a context" if id(r) in first_rows else r["population"]
        kind = counters.get(group, 0) % 5
        counters[group] = counters.get(group, 0) + 1
        if kind == 4:
            continue  # keep the model's own (UNCERTIFIED) text
        text = rubric.render(action if kind != 2 else (action + 1) % 6, caution=kind % 3, polite=kind == 1)
        ids = small_lab.tokenizer(text, add_special_tokens=False)["input_ids"]
        r.update(
            response=small_lab.tokenizer.decode(ids),
            response_ids=ids + [small_lab.eos_id],
            finish_reason="eos",
            ended_with_eos=True,
            length=len(ids) + 1,
        )
    for r in rows:
        del r["rubric"], r["expected_action"]
    library = ev.summarise_populations(ev.rubric_rows(rows, small_lab))
    rows = ev.rubric_rows(rows, small_lab)
    judged = rerun_rubric(rows, small_lab)
    for pop in POPULATIONS:
        again = recount_metrics(rows_of_population(rows, pop), judged, small_lab.eos_id)
        assert again["rubric_success"] > 0 and again["unsupported_certainty"] > 0
        assert library[pop].pop("finish_reasons") == again.pop("finish_reasons"), pop  # counts: exact
        assert library[pop] == pytest.approx(again, rel=1e-12), pop


def test_metric_recount_fails_on_a_changed_metric(small_results, small_lab):
    """The recount can fail: one published number off by one row is caught."""
    doctored = copy.deepcopy(small_results)
    doctored["policies"]["sft"]["metrics"]["probe_rows"]["without_eos"] -= 1
    with pytest.raises(AssertionError, match="sft.probe_rows.without_eos"):
        check_metrics_recomputed(doctored, small_lab)


def test_judge_accuracy_is_recomputed_from_stored_scores_small(small_results, small_lab, record_result):
    """Catches an accuracy that is not the share of chosen > rejected in the stored scores, a
    tie counted as a hit, and chosen and rejected swapped anywhere between corpus and score."""
    record_result("small.judge", check_judge_accuracy(small_results, small_lab))


def test_judge_check_fails_when_chosen_and_rejected_are_swapped(small_results, small_lab):
    doctored = copy.deepcopy(small_results)
    rows = doctored["judge_test"]["rows"]
    i = max(range(len(rows)), key=lambda k: abs(rows[k]["chosen_score"] - rows[k]["rejected_score"]))
    rows[i]["chosen_score"], rows[i]["rejected_score"] = rows[i]["rejected_score"], rows[i]["chosen_score"]
    with pytest.raises(AssertionError):
        check_judge_accuracy(doctored, small_lab)


def test_bootstrap_intervals_match_a_plain_python_resampling_small(small_results, small_lab, record_result):
    """Catches an interval over rows instead of families/contexts, another seed, another
    stratification or another percentile rule."""
    widths = check_bootstrap(small_results, small_lab)
    assert widths["learned_reward.probe_rows"] > 0, "the small run must give one non-degenerate interval"
    record_result("small.ci95_widths", widths)


def test_every_evaluation_token_is_the_greedy_argmax_small(small_results, small_lab, record_result):
    """Catches an evaluation that sampled (or decoded anything but the argmax)."""
    record_result("small.greedy", check_greedy(small_results, small_lab))


# ------------------------------------------------------------------------------ the session's lab run


def test_every_metric_is_recomputed_from_rows_by_the_rubric_lab(lab_results, lab_run):
    assert check_metrics_recomputed(lab_results, lab_run) > 0


def test_judge_accuracy_is_recomputed_from_stored_scores_lab(lab_results, lab_run, record_result):
    record_result("lab.judge", check_judge_accuracy(lab_results, lab_run))


def test_bootstrap_intervals_match_a_plain_python_resampling_lab(lab_results, lab_run, record_result):
    record_result("lab.ci95_widths", check_bootstrap(lab_results, lab_run))


def test_every_evaluation_token_is_the_greedy_argmax_lab(lab_results, lab_run, record_result):
    record_result("lab.greedy", check_greedy(lab_results, lab_run))
