"""The testbed rule (rlhf.studies.testbed) and the SFT recipes it chooses among
(rlhf.studies.derivation.RECIPES): each verdict recomputed by hand, each recipe's profile and
demonstrations checked, and a profile key added later leaving every profile without it its
identity."""

import math
from collections import Counter

import pytest

from rlhf.config import ProfileError, load_profile, override, profile_hash, profile_text_with
from rlhf.corpus import build_corpus
from rlhf.optim import epoch_budget
from rlhf.sft import sft_demonstrations
from rlhf.studies import testbed
from rlhf.studies.derivation import DEMONSTRATIONS, RECIPES, SFT_RECIPES, budget_changes, write_run_profile

pytestmark = pytest.mark.unit


def by_hand(values):
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, sd


@pytest.mark.parametrize(
    "values, in_band, sd_ok, min_ok",
    [
        ([0.30, 0.32, 0.28, 0.35, 0.25], True, True, True),
        ([0.489, 0.450, 0.022, 0.000, 0.639], True, False, False),  # r002's confirmation SFTs at 6 epochs
        ([0.05, 0.06, 0.07, 0.05, 0.06], False, True, True),  # below the band: no room to read
        ([0.9, 0.95, 0.92, 0.91, 0.93], False, True, True),  # above it: SFT leaves little to gain
        ([0.40] * 9 + [0.15], True, True, False),  # one seed of 10 below half the mean, SD 0.079
    ],
)
def test_stability_verdicts_recomputed_by_hand(values, in_band, sd_ok, min_ok):
    got = testbed.stability(values, testbed.ROUNDS[1])
    mean, sd = by_hand(values)
    assert got["mean"] == pytest.approx(mean) and got["sd"] == pytest.approx(sd) and got["min"] == min(values)
    assert (got["in_band"], got["sd_ok"], got["min_ok"]) == (in_band, sd_ok, min_ok)
    assert (mean >= 0.1 and mean <= 0.7) == in_band and (sd <= 0.10) == sd_ok and (min(values) >= mean / 2) == min_ok
    assert got["stable_with_room"] == (in_band and sd_ok and min_ok)


def test_the_sd_bound_is_inclusive_and_read_on_the_sample_sd():
    # two seeds at 0.3 +- 0.05 * sqrt(2): sample SD exactly 0.1 (a population SD would say 0.0707)
    d = 0.1 / math.sqrt(2)
    at = testbed.stability([0.3 - d, 0.3 + d])
    assert at["sd"] == pytest.approx(0.1) and at["sd_ok"] == (at["sd"] <= 0.1)
    over = testbed.stability([0.3 - 1.01 * d, 0.3 + 1.01 * d])
    assert not over["sd_ok"] and not over["stable_with_room"]


def candidate(name, values, gain=None):
    c = {"name": name, "sft": testbed.stability(values)}
    if gain is not None:
        c["oracle"] = {"gain": gain}
    return c


STABLE = [0.30, 0.32, 0.28, 0.35, 0.25]
UNSTABLE = [0.489, 0.450, 0.022, 0.000, 0.639]


def test_the_choice_is_the_largest_oracle_gain_among_the_stable_candidates_with_room():
    cands = [
        candidate("a", STABLE, 0.12),
        candidate("b", UNSTABLE, 0.40),  # the largest gain, but SFT's seed decides it: never chosen
        candidate("c", STABLE, 0.20),
        candidate("d", STABLE, 0.20),  # a tie: the earlier one
    ]
    assert testbed.choose(cands) == "c"
    assert testbed.choose([candidate("a", STABLE, 0.0999), candidate("b", UNSTABLE, 0.4)]) is None
    assert testbed.choose([candidate("a", STABLE, 0.10)]) == "a"  # at least GAIN: inclusive
    assert testbed.choose([candidate("a", STABLE)]) is None  # no oracle measured: no choice


def test_round_2_s_band_leaves_at_least_the_oracle_s_gain_of_room():
    r1, r2 = testbed.ROUNDS[1], testbed.ROUNDS[2]
    assert (r2.low, r2.high) == (r1.low, 1 - testbed.GAIN) == (0.1, 0.9)
    demos6 = [0.772, 0.689, 0.728, 0.917, 0.983, 0.789, 0.778, 0.822, 0.739, 0.739]  # round 1's sft-demos6
    assert not testbed.stability(demos6, r1)["stable_with_room"] and testbed.stability(demos6, r2)["stable_with_room"]
    assert not testbed.stability([0.95, 0.93, 0.91, 0.96, 0.94], r2)["in_band"]  # less than GAIN left to gain
    assert testbed.stability([0.9] * 3, r2)["in_band"]  # inclusive
    assert testbed.LATEST == max(testbed.ROUNDS) and testbed.stability(demos6) == testbed.stability(demos6, r2)
    assert (testbed.ROUNDS[3].low, testbed.ROUNDS[3].high) == (r2.low, r2.high)  # round 3 keeps the band


def test_each_round_is_stated_in_its_rule_and_says_when_it_was_declared():
    for n, r in testbed.ROUNDS.items():
        text = testbed.rule(r)
        assert r.number == n and text.startswith(f"round {n}:") and f"[{r.low}, {r.high}]" in text
        assert all(c in text for c in r.candidates) and r.declared
    assert "round 1" in testbed.ROUNDS[2].declared and "round 2" in testbed.ROUNDS[3].declared


@pytest.mark.parametrize("n", sorted(testbed.ROUNDS))
def test_every_candidate_is_a_recipe_the_studies_take_and_its_profile_loads(n):
    embedded = load_profile("embedded")
    for name in testbed.ROUNDS[n].candidates:
        assert name in SFT_RECIPES
        p = override(embedded, budget_changes(embedded, name))
        demos = len(range(0, DEMONSTRATIONS, p.sft.demonstration_stride or 1))
        assert epoch_budget(demos, p.sft.examples_per_update, p.sft)[1] == p.sft.expected_updates


@pytest.mark.parametrize("name", [n for n in RECIPES if "demos" in n])
def test_fewer_demonstrations_keep_each_situation_s_share_and_about_the_declared_updates(name):
    embedded = load_profile("embedded")
    p = override(embedded, budget_changes(embedded, name))
    corpus = build_corpus("r002")
    actions = {r["document_id"]: r["action"] for r in corpus["labels"]["warmstart"]["train"]}

    class View:  # what SFT reads of the learning view
        def demonstrations(self, split):
            assert split == "train"
            return corpus["inputs"]["warmstart"]["train"]

    demos = sft_demonstrations(View(), p.sft)
    count, _, updates = name.removeprefix("sft-demos").partition("-ppo")[0].partition("-u")
    assert len(demos) == int(count)
    counts = Counter(actions[d["document_id"]] for d in demos)
    assert sorted(counts) == list(range(6)) and len(set(counts.values())) == 1  # every situation, equally
    per_epoch = -(-len(demos) // p.sft.examples_per_update)
    assert p.sft.expected_updates == per_epoch * p.sft.epochs
    declared = int(updates) if updates else embedded.sft.expected_updates
    assert abs(p.sft.expected_updates - declared) <= per_epoch / 2
    assert sft_demonstrations(View(), embedded.sft) == View().demonstrations("train")  # absent: every one


def test_a_profile_key_added_later_leaves_every_profile_without_it_its_identity(tmp_path):
    embedded = load_profile("embedded")
    data = embedded.to_dict()
    assert "demonstration_stride" not in data["sft"]  # absent, so not part of the hash's data
    assert data["sft"]["max_updates_per_epoch"] is None  # an older optional key stays as it was hashed
    # the committed identity of the embedded profile, which every committed study and run records
    assert profile_hash(embedded) == "41ec2214c4e7d5d737b770809120388f5104ba22158e20ed4b354183143df4c2"
    strided = override(embedded, {("sft", "demonstration_stride"): 2})
    assert strided.sft.demonstration_stride == 2 and profile_hash(strided) != profile_hash(embedded)
    assert override(strided, {("sft", "demonstration_stride"): None}) == embedded
    # its TOML form reads back as the same profile
    text = profile_text_with(embedded.source.read_text(), "embedded-demos84", budget_changes(embedded, "sft-demos84"))
    path = tmp_path / "profile.toml"
    path.write_text(text)
    assert load_profile(str(path)) == override(
        embedded, {(None, "name"): "embedded-demos84", **budget_changes(embedded, "sft-demos84")}
    )
    run = write_run_profile(
        tmp_path / "run.toml", embedded.source.read_text(), "x", budget_changes(embedded, "sft-demos42")
    )
    assert (run.sft.demonstration_stride, run.sft.epochs, run.sft.expected_updates) == (4, 70, 420)


@pytest.mark.parametrize("bad", [0, -3])
def test_a_stride_below_one_is_refused_naming_the_key(bad):
    with pytest.raises(ProfileError, match=rf"demonstration_stride must be at least 1, not {bad}"):
        override(load_profile("embedded"), {("sft", "demonstration_stride"): bad})


def test_lower_rate_recipes_change_only_the_rate():
    embedded = load_profile("embedded")
    for name in ("sft-lr1e-3", "sft-lr1.5e-3"):
        changed = override(embedded, budget_changes(embedded, name))
        assert changed.sft.lr == float(name.removeprefix("sft-lr"))
        assert override(changed, {("sft", "lr"): embedded.sft.lr}) == embedded


@pytest.mark.parametrize("name", [n for n in RECIPES if "-ppo-lr" in n])
def test_a_ppo_rate_recipe_is_its_sft_recipe_with_only_ppo_s_actor_rate_changed(name):
    embedded = load_profile("embedded")
    sft_recipe, _, rate = name.partition("-ppo-lr")
    changed = override(embedded, budget_changes(embedded, name))
    assert changed.ppo.actor_lr == float(rate) < embedded.ppo.actor_lr
    assert override(changed, {("ppo", "actor_lr"): embedded.ppo.actor_lr}) == override(
        embedded, budget_changes(embedded, sft_recipe)
    )


def test_the_rule_text_and_the_help_state_the_constants():
    from rlhf.cli import build_parser

    help_text = " ".join(build_parser()._subparsers._group_actions[0].choices["choose-testbed"].format_help().split())
    latest = testbed.ROUNDS[testbed.LATEST]
    for name in latest.candidates:
        assert name in help_text and name in testbed.rule(latest)
    for number in (testbed.SEEDS, testbed.ORACLE_SEEDS, latest.low, latest.high, testbed.MAX_SD, testbed.GAIN):
        assert f"{number}" in testbed.rule(latest)
    assert f"trained with {testbed.SEEDS} seeds" in help_text and f"first {testbed.ORACLE_SEEDS} seeds" in help_text
    assert f"[{latest.low}, {latest.high}]" in help_text and f"at most {testbed.MAX_SD}" in help_text
    assert f"--round {{{','.join(map(str, sorted(testbed.ROUNDS)))}}}" in help_text
    assert f"{testbed.MIN_SHARE} x the mean" in help_text and f"at least {testbed.GAIN}" in help_text


@pytest.mark.parametrize(
    "sft, best_gold, qualifies", [(0.50, 0.55, False), (0.25, 0.375, True), (0.0, 0.10, True), (0.30, 0.39, False)]
)
def test_the_oracle_qualifies_on_its_gain_over_sft_never_on_its_own_gold(
    monkeypatch, tmp_path, sft, best_gold, qualifies
):
    """rlhf.studies.sft_budget.oracle_gain on a stand-in frontier study: gold 0.55 over SFT 0.50 is
    a gain of +0.05 (below +0.10, though the gold itself is far above 0.10); +0.10 qualifies."""
    from rlhf.studies import sft_budget

    seen = {}

    def frontier(folder, *, n, settings, **kwargs):
        seen.update(folder=folder, n=n, arms=[a.name for a in settings.arms])
        best = {"iteration": 40, "gold": best_gold, "gain": best_gold - sft}
        return {"sft_level": {"mean": sft}, "seeds": [{"sft": {"gold": sft}}] * n, "arms": {"oracle": {"best": best}}}

    monkeypatch.setattr(sft_budget, "run_frontier", frontier)
    got = sft_budget.oracle_gain(tmp_path, "sft-demos6", "r002", "embedded", 1, print, n=5, prefix="oracle")
    assert got["gain"] == pytest.approx(best_gold - sft) and got["qualifies"] is qualifies
    assert (got["best_gold"], got["sft_gold"], got["best_iteration"]) == (best_gold, sft, 40)
    assert seen == {"folder": tmp_path / "oracle-sft-demos6", "n": 5, "arms": ["oracle"]}


def test_one_sft_run_of_step_1_is_its_seed_profile_trained_once_and_kept(tmp_path, small_profile_file):
    """testbed.sft_task, as a worker runs it: candidate c at seed i is the frontier's seed-i
    profile at recipe c (measure_budget on testbed.seed_profile, called here, gives the same
    numbers to the bit), its row is written to WORK/sft/c/seed-i.json, and never overwritten."""
    from rlhf.identities import code_sha256
    from rlhf.io import read_json
    from rlhf.studies.sft_budget import measure_budget, prepare_work

    work, candidate, i = tmp_path / "work", "sft-lr1e-3", 1
    row = testbed.sft_task(str(work), "r002", str(small_profile_file), candidate, i)
    kept = work / "sft" / candidate / f"seed-{i}.json"
    assert read_json(kept) == row
    assert (row["candidate"], row["seed_index"], row["code"]) == (candidate, i, code_sha256())
    profile = testbed.seed_profile(load_profile(str(small_profile_file)), candidate, i)
    assert profile.sft.lr == RECIPES[candidate]["lr"]
    assert row["updates"] == profile.sft.epochs * profile.sft.max_updates_per_epoch
    view, tokenizer, eos_id, pad_id = prepare_work(work, "r002", profile)
    again = measure_budget(view, work / "base_model", profile, tokenizer, eos_id, pad_id)
    assert again["validation"] == row["validation"] and again["validation"]["n"] == 180
    assert again["last_validation_loss"] == row["last_validation_loss"]
    before = kept.read_bytes()
    with pytest.raises(FileExistsError):
        testbed.sft_task(str(work), "r002", str(small_profile_file), candidate, i)
    assert kept.read_bytes() == before
