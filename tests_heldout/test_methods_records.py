"""The committed comparisons of DPO and GRPO with PPO on validation (results/methods-r002/, on the
choice's testbed; results/methods-r001/, on the r001 frontier's) and the declarations of their
readings on test (results/methods-r00N-test/study.json), read back and recomputed: both
declarations follow from the committed records alone; each method's best point follows from the
committed frontier's curves; the PPO arms are, point for point, the seeds their design was chosen
on; every arm's cost names its phases (GRPO's without a critic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.studies import compare_methods

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# study -> (the record it was declared from, the frontier whose seeds its PPO arms repeat, its
# reading on test, the study whose seed count that reading takes, that count)
STUDIES = {
    "methods-r002": ("results/choice-r002/choice.json", "results/choice-r002/selection/frontier.json",
                     "methods-r002-test", compare_methods.VERDICT_STUDY, 15),
    "methods-r001": ("results/frontier-r001/frontier.json", "results/frontier-r001/frontier.json",
                     "methods-r001-test", "results/frontier-r001/confirmation-study.json", 5),
}  # fmt: skip


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(params=sorted(STUDIES))
def study(request):
    return request.param


@pytest.fixture
def record(study):
    return load(ROOT / "results" / study / "methods.json")


def test_the_declarations_follow_from_the_committed_records(study, record):
    source, _, test_folder, seeds_study, n = STUDIES[study]
    again = compare_methods.declaration(load(ROOT / source), source)
    assert load(ROOT / "results" / study / "study.json")["identity"] == again == record["declared"]
    confirm = compare_methods.confirm_declaration(record, f"results/{study}/methods.json", str(ROOT / seeds_study))
    committed = load(ROOT / "results" / test_folder / "study.json")["identity"]
    assert committed == {**confirm, "seeds_as": seeds_study} and committed["seeds"] == n
    assert committed["methods_commit"] == record["ran_with"]["commit"]


def test_each_methods_best_point_follows_from_the_committed_frontier(study, record):
    frontier = load(ROOT / "results" / study / "frontier" / "frontier.json")
    assert len(frontier["seeds"]) == compare_methods.SEEDS
    assert record["best"] == compare_methods.best_points(frontier)
    for method in ("dpo", "grpo"):
        best = record["best"][method]
        assert frontier["arms"][best["arm"]]["method"] == method
        rows = [r for name, a in frontier["arms"].items() if a.get("method") == method for r in a["curve"][1:]]
        assert best["mean_validation_gold"] == max(r["gold"]["mean"] for r in rows)


def test_the_ppo_arms_are_the_selection_seeds_point_for_point(study, record):
    """The same study seed, recipe and code path: seeds 0 to 2 of the study the design was chosen
    on (the choice's selection, the r001 frontier), measured again here beside DPO and GRPO, come
    out byte for byte the same."""
    ours = load(ROOT / "results" / study / "frontier" / "frontier.json")["seeds"]
    theirs = load(ROOT / STUDIES[study][1])["seeds"]
    ppo = [a for a in record["declared"]["arms"] if not a.startswith(("dpo", "grpo"))]
    assert len(ppo) == 3
    for arm in ppo:
        for i in range(compare_methods.SEEDS):
            assert ours[i]["arms"][arm]["points"] == theirs[i]["arms"][arm]["points"], (arm, i)
    assert [s["sft"] for s in ours] == [s["sft"] for s in theirs[: compare_methods.SEEDS]]


def test_each_arms_cost_names_its_phases_and_grpo_has_no_critic(record):
    costs = record["costs"]
    assert set(costs) == set(record["declared"]["arms"])
    for name, c in costs.items():
        if c["method"] == "dpo":
            assert c["seconds_per_epoch"] > 0 and c["epochs"] == compare_methods.SEEDS * compare_methods.DPO_EPOCHS
            continue
        assert c["iterations"] == 300 and c["seconds_per_iteration"] > sum(c["phases"].values()) * 0.5
        critic = {"critic_values", "critic_update"} & set(c["phases"])
        assert bool(critic) == (c["method"] == "ppo"), name


@pytest.mark.parametrize("test_folder", ["methods-r002-test", "methods-r001-test"])
def test_the_methods_confirmation_is_recomputed_from_its_per_seed_test_success(test_folder, record_result):
    """results/methods-r00N-test/confirmation.json: the declaration committed before the read, the
    declared seed count, and every comparison's per-seed differences and statistics from the
    per-seed test success of SFT and of each point."""
    from rlhf.studies.statistics import paired

    folder = ROOT / "results" / test_folder
    rec = load(folder / "confirmation.json")
    assert rec["declared"] == load(folder / "study.json")["identity"]
    table = rec["test_success"]
    n = rec["declared"]["seeds"]
    assert set(table) == {"sft", "dpo", "grpo", "default"} and {len(v) for v in table.values()} == {n}
    for name, (a, b) in rec["declared"]["comparisons"].items():
        got = rec["comparisons"][name]
        diffs = [x - y for x, y in zip(table[a], table[b])]
        assert got["per_seed"] == pytest.approx(diffs, abs=1e-15)
        assert {k: got[k] for k in paired(got["per_seed"])} == paired(got["per_seed"])
        assert got["n"] == n
        record_result(f"{test_folder}/{name}", {k: got[k] for k in ("mean", "t95", "sign_flip_p", "seeds_up", "n")})


@pytest.mark.parametrize("test_folder", ["methods-r002-test", "methods-r001-test"])
def test_confirm_methods_run_whole_on_the_committed_test_success_gives_the_committed_confirmation(
    test_folder, tmp_path, monkeypatch
):
    """`rlhf confirm-methods` from the committed methods record, with training and test evaluation
    replayed from the committed per-seed success (tests_heldout/replay.py): the same declaration,
    seeds and arms asked for, and the same comparisons."""
    from replay import replay_reading

    monkeypatch.chdir(ROOT)
    committed = load(ROOT / "results" / test_folder / "confirmation.json")
    declared = committed["declared"]
    asked = replay_reading(monkeypatch, committed["test_success"], declared["points"])
    again = compare_methods.confirm_methods(declared["methods"], tmp_path / "t", workers=1, say=lambda _: None)
    n = declared["seeds"]
    arms = sorted({p["arm"] for p in declared["points"].values()})
    assert asked["trained"] == [([f"seed-{i}" for i in range(n)], arms, declared["revision"], True)]
    assert again["declared"] == declared and again["comparisons"] == committed["comparisons"]
    assert again["test_success"] == committed["test_success"]
    for i in (0, n - 1):  # each seed's profile carries the declared study seed's training seeds
        name = f'name = "embedded-study{declared["study_seed"]}-seed{i}-{declared["sft_recipe"]}"'
        assert name in (tmp_path / "t" / f"seed-{i}" / "profile.toml").read_text()


def signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


@pytest.mark.parametrize("test_folder", ["methods-r002-test", "methods-r001-test"])
def test_the_readme_tables_of_the_methods_on_test_are_the_committed_ones(test_folder):
    """Each row of the README's table of a methods confirmation: its mean, interval and seeds up as
    the committed confirmation.json has them."""
    rec = load(ROOT / "results" / test_folder / "confirmation.json")
    readme = (ROOT / "README.md").read_text()
    points = rec["declared"]["points"]
    label = {"dpo": f"DPO (β {points['dpo']['arm'].removeprefix('dpo-b')}, epoch {points['dpo']['iteration']})",
             "grpo": f"GRPO (iteration {points['grpo']['iteration']})"}  # fmt: skip
    for name, c in rec["comparisons"].items():
        method, other = name.split("_minus_")
        row = f"| {label[method]} − SFT |" if other == "sft" else f"| {method.upper()} − the SPEC's default |"
        cells = f" {signed(c['mean'])} [{signed(c['t95'][0])}, {signed(c['t95'][1])}] |"
        up = f" {c['seeds_up']} of {c['n']} |"
        lines = [line for line in readme.splitlines() if line.startswith(row) and line.endswith(up)]
        assert any(cells in line for line in lines), (test_folder, name, row + cells)


def test_the_committed_reproduction_of_a_methods_seed_is_identical():
    """methods-r001/frontier/reproduce-seed-0.json: `rlhf reproduce results/methods-r001/frontier
    --seed 0` (its SFT, judge, three PPO arms, two DPO arms and the GRPO arm, each measured on
    validation), byte for byte, under the pinned arithmetic, by the code that made the study."""
    folder = ROOT / "results" / "methods-r001" / "frontier"
    rec = load(folder / "reproduce-seed-0.json")
    assert rec["results"] == "results/methods-r001/frontier" and rec["seed"] == 0 and rec["identical"] is True
    assert rec["first_difference"] is None and rec["arithmetic"].startswith("pinned:")
    frontier = load(folder / "frontier.json")
    assert rec["study_code"] == frontier["study"]["code"]
    assert {a.get("method", "ppo") for a in frontier["study"]["settings"]["arms"]} == {"ppo", "dpo", "grpo"}
