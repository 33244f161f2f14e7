"""The small frontier study (`small_frontier`, conftest) read again: warning rules chosen on one
study and scored on another, a study extended by new arms, and the curves, the choice and
best-of-n (alone and under the ensemble) recomputed from each seed's stored rows."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from frontier_checks import ROOT

from rlhf.config import load_profile
from rlhf.studies.statistics import across_seeds

# One xdist worker runs the frontier's files: the small study is built once, and no worker waits for another's.
pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("frontier")]


def test_warning_rules_are_chosen_on_one_study_frozen_and_scored_on_another(small_frontier, tmp_path):
    """Rules chosen on study A (window 1: the small study has 4 iterations) are frozen into a file
    with A's identity; scored on A they are in-sample, on study B out of sample, and B's data
    never enters the rules: changing B's histories changes B's scores, not the thresholds."""
    from rlhf.io import read_json, write_json
    from rlhf.studies.warnings import choose_rules, score_rules, study_runs

    out, result = small_frontier
    a = tmp_path / "a"
    shutil.copytree(out, a)
    b = tmp_path / "b"
    shutil.copytree(out, b)
    ident_b = {**read_json(b / "study.json")["identity"], "study_seed": 9}  # another study
    # B's histories cannot be read while A's rules are chosen.
    for h in b.glob("seed-*/arms/*/ppo/history.json"):
        h.rename(h.with_suffix(".hidden"))
    rules_file = tmp_path / "rules.json"
    frozen = choose_rules(a, rules_file, window=1, say=lambda line: None)
    assert frozen["chosen_on"]["study"]["revision"] == "r002" and frozen["window"] == 1
    with pytest.raises(FileExistsError):
        choose_rules(a, rules_file, window=1, say=lambda line: None)  # frozen: never overwritten
    for h in b.glob("seed-*/arms/*/ppo/history.hidden"):
        h.rename(h.with_suffix(".json"))
    folders_a = [a / s["folder"] for s in result["seeds"]]
    scored_a = score_rules(rules_file, folders_a, result["seeds"], read_json(a / "study.json")["identity"])
    assert scored_a["in_sample"] is True and scored_a["status"] == "scored"
    runs = study_runs(folders_a, result["seeds"], window=1)
    assert len(runs) == 2 * len(result["arms"])
    for sc, r in zip(scored_a["scores"], [r for r in frozen["rules"] if r["threshold"] is not None]):
        assert (sc["signal"], sc["threshold"], sc["patience"]) == (r["signal"], r["threshold"], r["patience"])
        defined = [run for run in runs if any(v is not None for v in run["series"][sc["signal"]])]
        assert sc["fell"] + sc["held"] == len(defined) and len(sc["runs"]) == len(defined)
        assert sc["early"] + sc["late"] + sc["misses"] == sc["fell"]
    # B: its histories' entropies changed; the rules are the frozen ones, its scores its own.
    for h in b.glob("seed-*/arms/*/ppo/history.json"):
        history = read_json(h)
        for it in history["iterations"]:
            it["entropy"] = 0.0
        h.unlink()
        write_json(h, history)
    folders_b = [b / s["folder"] for s in result["seeds"]]
    scored_b = score_rules(rules_file, folders_b, result["seeds"], ident_b)
    assert scored_b["in_sample"] is False
    assert [(s["threshold"], s["patience"]) for s in scored_b["scores"]] == [
        (s["threshold"], s["patience"]) for s in scored_a["scores"]
    ]
    entropy_b = next(s for s in scored_b["scores"] if s["signal"] == "entropy_drop")
    assert all(r["fired_at"] is None or r["fired_at"] >= 0 for r in entropy_b["runs"])


def test_the_summary_scores_the_committed_rules_and_the_page_shows_them(small_frontier):
    from rlhf.signals import RULES_FILE

    out, result = small_frontier
    warn = result["warnings"]
    if not RULES_FILE.is_file():
        assert warn["status"].startswith("no frozen warning rules")
        return
    assert warn["status"] == "scored" and warn["rules_file"] == RULES_FILE.name
    assert warn["in_sample"] is False  # chosen on the full r002 study, not on this small one
    page = (out / "report.html").read_text()
    assert "Over-optimisation warnings" in page


def test_a_study_extended_by_grid_arms_keeps_what_it_measured_and_runs_only_the_new(small_frontier, tmp_path):
    """Adding grid values to a finished study (rlhf frontier --grid ...): its arms' measurements
    are kept byte for byte, only the new arm runs (and the arms at the grid's best c again, moved
    aside first, if the best c moved), the old summary is moved aside, study.json records what it extended."""
    from conftest import small_frontier_settings
    from rlhf.io import read_json
    from rlhf.studies.frontier.arms import Arm, Settings
    from rlhf.studies.frontier.study import run_frontier

    out, result = small_frontier
    study = tmp_path / "study"
    shutil.copytree(out, study)
    before = {p: p.read_bytes() for p in study.glob("seed-*/arms/*/validation/*.json")}
    old = small_frontier_settings()
    arms = (*old.arms[:2], Arm("c1", "judge", c=1.0), *old.arms[2:])
    settings = Settings(arms=arms, bon_ns=old.bon_ns, kl_samples=old.kl_samples)
    said: list[str] = []
    again = run_frontier(
        study, n=2, revision="r002", sft_budget="full", workers=1,
        profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=settings, say=said.append,
    )  # fmt: skip
    assert "c1" in again["arms"] and set(result["arms"]) < set(again["arms"])
    moved = again["grid_choice"]["c"] != result["grid_choice"]["c"]
    for path, data in before.items():
        if "ensemble-min-cbest" in str(path) and moved:
            continue
        assert path.read_bytes() == data, path  # measured once, kept
    record = read_json(study / "study.json")
    assert record["identity"] == again["study"] and record["extended_from"] == [result["study"]]
    assert (study / "frontier-before-extension-1.json").is_file()
    assert any("extended by the arms c1" in line for line in said)
    for s in again["seeds"]:
        stale = list((study / s["folder"] / "arms").glob("ensemble-min-cbest@c*"))
        assert len(stale) == (1 if moved else 0)
        profile = load_profile(str(study / s["folder"] / "arms" / "ensemble-min-cbest" / "profile.toml"))
        assert profile.ppo.kl_coef == again["grid_choice"]["c"] * s["sigma_validation"]
    # Changing an arm, not adding one, is still refused.
    changed = Settings(arms=(old.arms[0], Arm("c0.05", "judge", c=0.07), *old.arms[2:]))
    (study / "frontier.json").unlink()
    from rlhf.studies import StudyError

    with pytest.raises(StudyError, match="refusing to continue"):
        run_frontier(
            study, n=2, revision="r002", sft_budget="full", workers=1,
            profile_name=str(out.parent / "embedded-frontier-small.toml"), settings=changed, say=lambda line: None,
        )  # fmt: skip


def test_the_stopping_rule_is_the_best_rule_of_the_study_the_rules_were_chosen_on():
    """The confirmation's stop signal is not picked by hand: recomputed from the committed r002
    study's in-sample scores (the study the frozen rules were chosen on), by the declared
    criterion, written out here (most early warnings; ties: fewer false alarms)."""
    from rlhf import signals
    from rlhf.io import sha256_file
    from rlhf.studies.frontier.confirmation import STOP_SIGNAL
    from rlhf.studies.warnings import best_rule

    scored = json.loads((ROOT / "results" / "frontier-r002" / "frontier.json").read_text())["warnings"]
    assert scored["in_sample"] is True and scored["rules_sha256"] == sha256_file(signals.RULES_FILE)
    top = max(s["early"] for s in scored["scores"])
    (by_hand,) = [
        s["signal"]
        for s in scored["scores"]
        if s["early"] == top
        and s["false_alarms"] == min(t["false_alarms"] for t in scored["scores"] if t["early"] == top)
    ]
    assert best_rule(scored) == by_hand == STOP_SIGNAL
    # the rule the lab then applies is that signal's frozen rule
    rules, _ = signals.frozen_rules()
    assert [r.signal for r in rules].count(STOP_SIGNAL) == 1
    tied = {
        **scored,
        "scores": [{**s, "early": 5, "false_alarms": 9 if s["signal"] == "kl" else 3} for s in scored["scores"]],
    }
    assert best_rule(tied) == signals.SIGNALS[1]  # the first in SIGNALS' order among the fewest false alarms


def test_curves_and_the_choice_recomputed_from_each_seeds_stored_rows(small_frontier):
    """Every curve point is the mean over seeds of each seed's measurement, each measurement's gold
    and proxy the mean of its stored rows; the choice is the best mean validation gold by the
    written rule (oracle excluded, iteration >= 1; ties: smaller mean d, earlier arm, earlier
    iteration), all recomputed here from the files, not by the module's functions."""
    out, result = small_frontier
    folders = [out / s["folder"] for s in result["seeds"]]
    sft_gold = []
    for f in folders:
        it0 = json.loads((f / "frontier" / "sft.json").read_text())["iteration_0"]
        assert it0["gold"] == sum(r["rubric_success"] for r in it0["rows"]) / len(it0["rows"])
        sft_gold.append(it0["gold"])
    assert result["sft_level"]["mean"] == pytest.approx(sum(sft_gold) / len(sft_gold), abs=1e-12)
    candidates = []
    for k, (name, arm) in enumerate(result["arms"].items()):
        for row in arm["curve"][1:]:
            golds, ds, gains = [], [], []
            for f, g0 in zip(folders, sft_gold):
                m = json.loads((f / "arms" / name / "validation" / f"iter-{row['iteration']:04d}.json").read_text())
                rows = m["rows"]
                assert m["gold"] == sum(r["rubric_success"] for r in rows) / len(rows)
                assert m["proxy"] == pytest.approx(sum(r["learned_reward"] for r in rows) / len(rows), abs=1e-9)
                golds.append(m["gold"])
                ds.append(m["d"])
                gains.append(m["gold"] - g0)
            assert row["gold"]["mean"] == pytest.approx(sum(golds) / len(golds), abs=1e-12)
            assert row["d"]["mean"] == pytest.approx(sum(ds) / len(ds), abs=1e-12)
            assert row["gain"]["mean"] == pytest.approx(sum(gains) / len(gains), abs=1e-12)
            if arm["design"] != "oracle":
                candidates.append((-sum(golds) / len(golds), sum(ds) / len(ds), k, row["iteration"], name))
    best = sorted(candidates)[0]
    sel = result["selection"]
    assert (sel["arm"], sel["iteration"]) == (best[4], best[3])
    assert sel["mean_validation_gold"] == pytest.approx(-best[0], abs=1e-12)
    assert sel["above_sft"] == (sel["mean_validation_gold"] > result["sft_level"]["mean"])


def test_best_of_n_recomputed_from_each_seeds_stored_samples(small_frontier):
    """Best-of-n keeps, per prompt, the judge's highest-scored of the first n samples (the first on
    a tie); its gold and proxy are the means of the kept samples' success and score; the proxy on
    the judge's own scale is (proxy - mean) / SD of that seed's SFT samples; the across-seed row
    is their mean. Recomputed from the stored per-prompt samples."""
    out, result = small_frontier
    per_seed = {n: [] for n in (1, 2)}
    for s in result["seeds"]:
        sft = json.loads((out / s["folder"] / "frontier" / "sft.json").read_text())
        bon = sft["best_of_n"]
        scores, successes = bon["scores"], bon["successes"]
        for point in bon["points"]:
            n = point["n"]
            kept = []
            for prompt_scores in scores:
                top = prompt_scores[0]
                j = 0
                for i in range(1, n):
                    if prompt_scores[i] > top:
                        top, j = prompt_scores[i], i
                kept.append(j)
            gold = sum(successes[p][j] for p, j in enumerate(kept)) / len(kept)
            proxy = sum(scores[p][j] for p, j in enumerate(kept)) / len(kept)
            assert point["gold"] == pytest.approx(gold, abs=1e-12)
            assert point["proxy"] == pytest.approx(proxy, abs=1e-9)
            assert point["kl_bound"] == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-15)
            spread = sft["spread"]["validation"]
            per_seed[n].append((gold, (proxy - spread["mean"]) / spread["sd"]))
        # sigma: the sample SD of the judge's scores of each prompt's first temperature-1 SFT sample
        first = [prompt_scores[0] for prompt_scores in scores]
        mean = sum(first) / len(first)
        sd = math.sqrt(sum((x - mean) ** 2 for x in first) / (len(first) - 1))
        assert bon["spread"]["mean"] == pytest.approx(mean, abs=1e-9) and bon["spread"]["sd"] == pytest.approx(
            sd, rel=1e-9
        )
        assert s["sigma_validation"] == sft["spread"]["validation"]["sd"] == pytest.approx(sd, rel=1e-9)
    for point in result["best_of_n"]["points"]:
        golds = [g for g, _ in per_seed[point["n"]]]
        stds = [p for _, p in per_seed[point["n"]]]
        assert point["gold"]["mean"] == pytest.approx(sum(golds) / len(golds), abs=1e-12)
        assert point["proxy_std"]["mean"] == pytest.approx(sum(stds) / len(stds), abs=1e-9)


def _favourite(scores: list[float], n: int) -> int:
    """The first of the highest among the first n (written out, not rlhf's best_of)."""
    top, j = scores[0], 0
    for i in range(1, n):
        if scores[i] > top:
            top, j = scores[i], i
    return j


def test_best_of_n_under_the_ensemble_recomputed_from_each_members_scores(small_frontier):
    """Best-of-n ranked by an ensemble reward: the same draws as under the judge (member 0's scores
    are the judge's best-of-n scores), the reward per sample the members' minimum, their mean, and
    mean - lambda * SD (divisor k) recomputed from each member's stored score, the favourite of the
    first n by that reward, its gold from the stored successes; across seeds the mean, and the
    change of gold from n = 1 to the largest n per seed."""
    out, result = small_frontier
    e = result["best_of_n_ensemble"]
    assert set(e["designs"]) == {"ensemble-mean", "ensemble-min", "ensemble-uncertainty"}
    assert e["ensemble_size"] == 2 and e["members"] == ["judge", "judge-1"]  # the ensemble arm's k
    changes: dict[str, list[float]] = {d: [] for d in e["designs"]}
    golds: dict[tuple[str, int], list[float]] = {}
    for s in result["seeds"]:
        bon = json.loads((out / s["folder"] / "frontier" / "sft.json").read_text())["best_of_n"]
        rec = json.loads((out / s["folder"] / "frontier" / "best-of-n-ensemble.json").read_text())
        members = rec["member_scores"]  # [k][n][P]
        assert [[members[0][j][p] for j in range(len(members[0]))] for p in range(len(bon["scores"]))] == bon["scores"]
        assert rec["successes"] == bon["successes"]
        assert members[1] != members[0]  # another judge, not a copy
        lam = rec["ensemble_lambda"]
        for design, got in rec["designs"].items():
            for j in range(len(members[0])):
                for p in range(len(bon["scores"])):
                    xs = [m[j][p] for m in members]
                    mean = sum(xs) / len(xs)
                    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
                    want = {"ensemble-min": min(xs), "ensemble-mean": mean, "ensemble-uncertainty": mean - lam * sd}
                    assert got["rewards"][j][p] == pytest.approx(want[design], abs=1e-5), (design, j, p)
            rewards = [[got["rewards"][j][p] for j in range(len(members[0]))] for p in range(len(bon["scores"]))]
            for point in got["points"]:
                kept = [_favourite(r, point["n"]) for r in rewards]
                gold = sum(bon["successes"][p][j] for p, j in enumerate(kept)) / len(kept)
                assert point["gold"] == pytest.approx(gold, abs=1e-12), (design, point["n"])
                assert point["proxy"] == pytest.approx(sum(r[j] for r, j in zip(rewards, kept)) / len(kept), abs=1e-9)
                golds.setdefault((design, point["n"]), []).append(gold)
            changes[design].append(got["points"][-1]["gold"] - got["points"][0]["gold"])
        assert s["best_of_n_ensemble"] == {d: v["points"] for d, v in rec["designs"].items()}
    for design, summary in e["designs"].items():
        for point in summary["points"]:
            values = golds[(design, point["n"])]
            assert point["gold"]["mean"] == pytest.approx(sum(values) / len(values), abs=1e-12)
        assert summary["gold_change"]["mean"] == pytest.approx(sum(changes[design]) / len(changes[design]), abs=1e-12)
    judge = [s["best_of_n"][-1]["gold"] - s["best_of_n"][0]["gold"] for s in result["seeds"]]
    assert e["judge_gold_change"]["mean"] == pytest.approx(sum(judge) / len(judge), abs=1e-12)


def test_an_ensemble_best_of_n_of_other_draws_is_refused(small_frontier, tmp_path):
    """The ensemble's best-of-n must rank the judge's best-of-n draws: when the stored judge scores
    are not those of its draws (other samples), it refuses and writes nothing."""
    from rlhf.studies import StudyError
    from rlhf.studies.frontier.arms import settings_of
    from rlhf.studies.frontier.measure import ensemble_best_of_n

    out, result = small_frontier
    seed_dir = tmp_path / "seed-0"
    shutil.copytree(out / "seed-0", seed_dir)
    (seed_dir / "frontier" / "best-of-n-ensemble.json").unlink()
    shutil.rmtree(seed_dir / "best-of-n-ensemble")
    sft = json.loads((seed_dir / "frontier" / "sft.json").read_text())
    sft["best_of_n"]["scores"][0][1] += 1.0
    (seed_dir / "frontier" / "sft.json").write_text(json.dumps(sft))
    settings = settings_of(json.loads((out / "study.json").read_text())["identity"])
    with pytest.raises(StudyError, match="not the same samples"):
        ensemble_best_of_n(seed_dir, "r002", settings, log=False)
    assert not (seed_dir / "frontier" / "best-of-n-ensemble.json").exists()


def test_a_study_made_before_the_ensembles_best_of_n_gains_it_by_extension_only():
    """An identity without `bon_ensembles` (a study made before) is extended by that measurement
    alone; with any other setting changed too it is not an extension; a study that has it gains
    nothing."""
    from rlhf.studies.frontier.arms import Settings, settings_of
    from rlhf.studies.frontier.study import added_arms

    new = {"format": 1, "code": "b", "settings": Settings().record()}
    old = {**new, "code": "a", "settings": {k: v for k, v in new["settings"].items() if k != "bon_ensembles"}}
    assert added_arms(old, new) == ["best-of-n under the ensembles"]
    assert settings_of(old).bon_ensembles == ()
    assert added_arms(new, new) == []
    other = {**new, "settings": {**new["settings"], "kl_samples_per_prompt": 3}}
    assert added_arms(old, other) is None


def test_sign_counts_positive_seeds_and_the_sign_test_by_hand():
    stats = across_seeds([0.1, -0.2, 0.0, 0.3, 0.05, 0.0])
    assert (stats["positive"], stats["negative"], stats["zero"]) == (3, 1, 2)  # zeros are neither
    # two-sided exact sign test on the 4 non-zero seeds, 3 vs 1: 2 * P(X <= 1), X ~ Binomial(4, 1/2)
    assert stats["sign_test_p"] == pytest.approx(2 * (1 + 4) / 16)
    assert across_seeds([0.2, 0.1, 0.3, 0.4, 0.5])["sign_test_p"] == pytest.approx(2 / 32)
    assert across_seeds([0.0, 0.0])["sign_test_p"] == 1.0  # no non-zero seed: no evidence either way
