"""Bad input on resume (issue: changed identity, damaged state files, NaN loss) is refused
with a message naming the problem, and nothing existing is overwritten."""
import copy

import pytest

from rlhf import lab, ppo_math
from rlhf.checkpoint import StateError, load_state
from rlhf.config import load_profile
from rlhf.io import read_json, sha256_file
from rlhf.optim import NonFiniteError

pytestmark = pytest.mark.unit


def small_profile():
    p = copy.deepcopy(load_profile("embedded"))
    p["sft"]["epochs"] = 2
    p["judge"]["epochs"] = 2
    p["ppo"]["iterations"] = 3
    p["ppo"]["resume_stop_iteration"] = 1
    return p


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A small run: SFT stopped after epoch 1 (state saved), then full SFT, judge and PPO."""
    run = tmp_path_factory.mktemp("bad") / "run"
    ctx = lab.open_context(run, small_profile())
    lab.stage_sft(ctx, stop_after=1)
    return ctx


def test_resume_with_changed_config_is_refused(small_run):
    ctx = lab.open_context(small_run.run, {**small_profile(), "sft": {**small_profile()["sft"], "lr": 1e-3}})
    with pytest.raises(StateError, match="identity changed in config"):
        lab.stage_sft(ctx, resume=True)
    assert not (small_run.run / "sft" / "state-resumed.pt.gz").exists()


@pytest.mark.parametrize("part", ["corpus", "code", "base_model"])
def test_resume_with_changed_corpus_code_or_base_is_refused(small_run, part):
    path = small_run.run / "sft" / "state-stop001.pt.gz"
    identity = small_run.identity(stage="sft", initial=read_json(str(path) + ".json")["identity"]["initial"])
    load_state(path, identity)  # the run's own identity loads
    with pytest.raises(StateError, match=f"identity changed in {part}"):
        load_state(path, {**identity, part: "0" * 64})


def test_resume_with_a_different_base_model_is_refused(small_run, tmp_path):
    from rlhf.embedded import build_embedded
    other = tmp_path / "other_base"
    build_embedded(other, seed=50, audit=False)
    ctx = lab.open_context(small_run.run, small_profile(), model_dir=other)
    with pytest.raises(StateError, match="base_model"):
        lab.stage_sft(ctx, resume=True)


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_damaged_state_is_refused_and_nothing_is_overwritten(small_run, tmp_path, damage):
    import shutil
    src = small_run.run / "sft" / "state-stop001.pt.gz"
    before = sha256_file(src)
    bad = tmp_path / "state.pt.gz"
    shutil.copy(src, bad)
    shutil.copy(str(src) + ".json", str(bad) + ".json")
    data = bytearray(bad.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    with pytest.raises(StateError, match="truncated" if damage == "truncate" else "corrupted"):
        load_state(bad)
    assert sha256_file(src) == before


def test_resume_continues_to_the_end(small_run):
    result = lab.stage_sft(small_run, resume=True)
    assert result["state"]["epochs_done"] == 2
    with pytest.raises(FileExistsError):
        lab.stage_sft(small_run, resume=True)  # the resumed state exists: never overwritten


def test_nan_loss_stops_with_the_iteration_and_keeps_the_last_good_state(lab_run, tmp_path, monkeypatch):
    import shutil
    run = tmp_path / "run"
    # Reuse the session run's corpus, base, SFT actor and judge (their hashes travel with them).
    for part in ("corpus", "base_model"):
        shutil.copytree(lab_run.run / part, run / part)
    for stage, name in (("sft", "actor"), ("reward", "judge")):
        (run / stage).mkdir()
        for suffix in (".safetensors", ".safetensors.json"):
            shutil.copy(lab_run.run / stage / f"{name}{suffix}", run / stage / f"{name}{suffix}")
    ctx = lab.open_context(run, small_profile())
    lab.stage_ppo(ctx, stop_after=1)
    good = ctx.run / "ppo" / "state-stop001.pt.gz"
    before = sha256_file(good)
    real = ppo_math.clipped_policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] >= 2 else loss

    monkeypatch.setattr(ppo_math, "clipped_policy_loss", poisoned)
    with pytest.raises(NonFiniteError, match=r"PPO iteration 1 actor: loss is nan"):
        lab.stage_ppo(ctx, resume=True)
    assert sha256_file(good) == before
    assert not (ctx.run / "ppo" / "state-resumed.pt.gz").exists()
