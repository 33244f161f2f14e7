"""Bad input on resume (changed identity, damaged state files, a CUDA profile without CUDA) is refused
with a message naming the problem, and nothing existing is overwritten."""

import json
import re
import shutil

import pytest

from rlhf import identities, lab
from rlhf.checkpoint import StateError, load_state
from rlhf.config import load_profile, override
from rlhf.io import read_json, sha256_file
from rlhf.lab import run as lab_run
from rlhf.lab import stages as lab_stages

pytestmark = pytest.mark.unit


def bad_input_profile():
    return override(
        load_profile("embedded"),
        {("sft", "epochs"): 2, ("judge", "epochs"): 2, ("ppo", "iterations"): 3, ("ppo", "resume_stop_iteration"): 1},
    )


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A small run: SFT stopped after epoch 1 (state saved), then full SFT, judge and PPO."""
    run = tmp_path_factory.mktemp("bad") / "run"
    ctx = lab.open_context(run, bad_input_profile())
    lab.stage_sft(ctx, stop_after=1)
    return ctx


@pytest.mark.parametrize(
    "table,key,value",
    [
        ("sft", "lr", 1e-3),
        ("seeds", "torch", 50),
        ("ppo", "reward_design", "iterated-judge"),
        ("ppo", "truncation_penalty", -2.0),
        ("ppo", "kl_coef", 0.05),
        ("runtime", "torch_threads", 2),
    ],
)
def test_resume_with_changed_config_is_refused_naming_the_key(stopped_run, table, key, value):
    """Any profile value (a learning rate, a seed, the reward design, a PPO parameter, the thread
    count) changes the run's identity; the refusal names the key, its old and new value."""
    import torch

    before = sha256_file(stopped_run.run / "run.json")
    old = getattr(getattr(bad_input_profile(), table), key)
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    with pytest.raises(StateError) as refused:
        lab.open_context(stopped_run.run, override(bad_input_profile(), {(table, key): value}))
    # the refused run leaves this process as it was (its thread count and global generator)
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)
    message = str(refused.value)
    assert re.search(r"identity changed in [a-z, ]*config .*Nothing was written.*rlhf lab --out NEW_FOLDER", message)
    assert f"changed keys: [{table}] {key}: {old!r} -> {value!r}" in message
    assert not (stopped_run.run / "sft" / "state-resumed.pt.gz").exists()
    assert sha256_file(stopped_run.run / "run.json") == before


def test_every_profile_value_is_part_of_the_identity():
    """The config hash is over Profile.to_dict(): every field of every table is in it (a field
    left out there could change a result without changing the identity). The one exception: a key
    added after profiles were identified (`new_key`) is left out while absent (None, the behaviour
    before it existed), and is in the data as soon as it is set."""
    import dataclasses

    from rlhf.config import Profile, override

    profile = bad_input_profile()
    data = profile.to_dict()
    for table in dataclasses.fields(Profile):
        if table.name == "source":
            continue
        value = getattr(profile, table.name)
        if dataclasses.is_dataclass(value):
            fields = dataclasses.fields(value)
            absent_new = {f.name for f in fields if f.metadata.get("new_key") and getattr(value, f.name) is None}
            assert set(data[table.name]) == {f.name for f in fields} - absent_new, table.name
            for name in absent_new:  # set, it is part of the identity
                assert name in override(profile, {(table.name, name): 2}).to_dict()[table.name]
        else:
            assert table.name in data
    for table, key in (("ppo", "stop_signals"), ("ppo", "ensemble_lambda"), ("seeds", "judge_refresh")):
        assert key in data[table]


@pytest.mark.parametrize("part", ["revision", "code", "arithmetic", "profile", "dtype"])
def test_rerun_with_another_revision_code_pin_or_profile_is_refused(stopped_run, part, monkeypatch):
    """run.json: a rerun whose revision, code version, CPU pin, profile or compute dtype differs
    is refused, naming what changed and the command that starts afresh."""
    from rlhf import runtime

    if part == "revision":
        with pytest.raises(ValueError, match="holds corpus revision r001, not r002"):
            lab.open_context(stopped_run.run, bad_input_profile(), revision="r002")
        return
    if part == "code":
        monkeypatch.setattr(identities, "code_sha256", lambda: "f" * 64)
    elif part == "arithmetic":
        monkeypatch.setattr(runtime, "identity_tag", lambda: "unpinned:x86_64:AVX512:threads=1:off")
    elif part == "dtype":  # e.g. a run continued on a machine that computes the base in another dtype
        real = lab_run.compute_dtype
        monkeypatch.setattr(lab_run, "compute_dtype", lambda profile: {**real(profile), "dtype": "bfloat16"})
    profile = override(bad_input_profile(), {(None, "name"): "renamed"}) if part == "profile" else bad_input_profile()
    with pytest.raises(StateError, match=rf"identity changed in [a-z, ]*{part}.*start afresh"):
        lab.open_context(stopped_run.run, profile)


@pytest.mark.parametrize("part", ["corpus", "code", "base_model", "dtype"])
def test_resume_with_changed_corpus_code_or_base_is_refused(stopped_run, part):
    path = stopped_run.run / "sft" / "state-stop001.pt.gz"
    identity = stopped_run.identity(stage="sft", initial=read_json(str(path) + ".json")["identity"]["initial"])
    load_state(path, identity)  # the run's own identity loads
    assert identity["dtype"] == "float32"
    with pytest.raises(StateError, match=f"identity changed in {part}"):
        load_state(path, {**identity, part: "0" * 64})


def test_an_adopted_continuous_leg_is_hash_and_identity_checked(stopped_run, tmp_path):
    """rlhf.lab.adopt_continuous_leg (the dry run's rehearsal takes its measured legs over): a
    damaged source is refused as it is read, a state of other inputs when the protocol loads it,
    and a run's own leg is never replaced."""
    source = tmp_path / "source" / "sft"
    source.mkdir(parents=True)
    state = stopped_run.run / "sft" / "state-stop001.pt.gz"
    for suffix in ("", ".json"):
        shutil.copy(str(state) + suffix, str(source / "state-continuous.pt.gz") + suffix)
    other = lab.open_context(tmp_path / "run", override(bad_input_profile(), {("sft", "lr"): 1e-3}))
    assert lab.adopt_continuous_leg(other, source.parent, "sft") is True
    assert lab.adopt_continuous_leg(other, source.parent, "sft") is False  # its own is kept
    assert sha256_file(other.run / "sft" / "state-continuous.pt.gz") == sha256_file(state)
    with pytest.raises(StateError, match="identity changed in config"):
        lab.stage_sft(other, protocol=False)
    data = bytearray((source / "state-continuous.pt.gz").read_bytes())
    data[100] ^= 0xFF
    (source / "state-continuous.pt.gz").write_bytes(bytes(data))
    fresh = lab.open_context(tmp_path / "run2", bad_input_profile())
    with pytest.raises(StateError, match="hash mismatch"):
        lab.adopt_continuous_leg(fresh, source.parent, "sft")
    assert not (fresh.run / "sft" / "state-continuous.pt.gz").exists()


def test_resume_with_a_different_base_model_is_refused(stopped_run, tmp_path):
    from rlhf.embedded import build_embedded

    other = tmp_path / "other_base"
    build_embedded(other, seed=50, audit=False)
    with pytest.raises(StateError, match="identity changed in base_model"):
        lab.open_context(stopped_run.run, bad_input_profile(), model_dir=other)
    # and the state itself refuses it too (a second line of defence, e.g. a copied state file)
    path = stopped_run.run / "sft" / "state-stop001.pt.gz"
    saved = read_json(str(path) + ".json")["identity"]
    with pytest.raises(StateError, match="base_model"):
        load_state(path, {**saved, "base_model": "0" * 64})


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_damaged_state_is_refused_and_nothing_is_overwritten(stopped_run, tmp_path, damage):
    import shutil

    src = stopped_run.run / "sft" / "state-stop001.pt.gz"
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


def test_resume_continues_to_the_end(stopped_run):
    result = lab.stage_sft(stopped_run, resume=True)
    assert result.state["epochs_done"] == 2
    with pytest.raises(FileExistsError):
        lab.stage_sft(stopped_run, resume=True)  # the resumed state exists: never overwritten


# A NaN loss in PPO (and in SFT, the judge and the critic, with an infinite loss or gradient too)
# is tested in test_non_finite.py on the small-budget run: the stage stops naming stage, role and
# update, and the last checkpoint keeps its bytes.


def test_a_cuda_profile_without_cuda_is_refused_not_run_on_the_cpu(tmp_path, monkeypatch):
    """No silent CPU fallback. The qwen2.5-0.5b profile says cuda; without a CUDA device
    the context refuses before anything is prepared, naming how to run on the CPU on purpose."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    qwen = load_profile("qwen2.5-0.5b")
    assert qwen.device == "cuda"
    with pytest.raises(ValueError, match=r"runs on CUDA.*no silent fallback.*device = \"cpu\""):
        lab.profile_device(qwen)
    assert lab.profile_device(override(qwen, {(None, "device"): "cpu"})) == "cpu"
    assert lab.profile_device(load_profile("embedded")) == "cpu"
    with pytest.raises(ValueError, match="device must be"):
        lab.profile_device(override(qwen, {(None, "device"): "tpu"}))
    with pytest.raises(ValueError, match="no silent fallback"):
        lab.open_context(tmp_path / "run", "qwen2.5-0.5b", model_dir=tmp_path / "model")
    assert not (tmp_path / "run").exists()


def test_a_run_folder_of_the_old_layout_is_refused_naming_why(tmp_path):
    """The one compatibility rule for old run folders: a run folder whose judge stage is in reward/ (written
    before the judge had one name) is refused before anything is read or written."""
    run = tmp_path / "old"
    (run / "reward").mkdir(parents=True)
    (run / "reward" / "history.json").write_text("{}")
    with pytest.raises(StateError, match=r"old layout \(its judge stage is in reward/.*rlhf lab --out NEW_FOLDER"):
        lab.open_context(run, bad_input_profile())
    assert sorted(p.name for p in run.iterdir()) == ["reward"]
    (run / "judge").mkdir()  # a new-layout folder that merely has a reward/ beside it is not refused for it
    lab.refuse_old_layout(run)


def test_an_evaluation_is_taken_over_only_for_the_same_final_ppo_state(tmp_path):
    """rlhf.lab.adopt_evaluation (the dry run's rehearsal): refused, and nothing written, unless
    both runs' final PPO states have one SHA-256; a run's own evaluation is never replaced."""
    from types import SimpleNamespace

    from rlhf.io import write_json

    def run(name, ppo_sha):
        folder = tmp_path / name
        write_json(folder / "run.json", {"stages": {"ppo": {"complete": True, "sha256_final": ppo_sha}}})
        return folder

    source = run("measure", "a" * 64)
    write_json(source / "evaluation" / "results.json", {"policies": {"ppo": {"metrics": {"x": 1}}}})
    other = SimpleNamespace(run=run("other", "b" * 64))
    with pytest.raises(StateError, match="is not this run's"):
        lab.adopt_evaluation(other, source)
    assert not (other.run / "evaluation").exists()
    same = SimpleNamespace(run=run("same", "a" * 64))
    assert lab.adopt_evaluation(same, source) is True
    assert read_json(same.run / "evaluation" / "results.json") == read_json(source / "evaluation" / "results.json")
    assert lab.adopt_evaluation(same, source) is False


@pytest.mark.parametrize("command", ["lab", "seeds", "frontier", "base-study"])
def test_an_output_folder_that_is_a_file_is_refused_in_one_line(tmp_path, command, capsys, monkeypatch):
    """`--out FILE` (an existing file where a run or study folder belongs): one line naming the
    file and the problem, exit 2, the file unchanged and nothing written beside it."""
    from rlhf import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("notes\n")
    assert cli.main([command, "--out", "README.md"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"rlhf {command}: error: README.md is a file, not a folder: name a new folder, or the folder of a run or "
        "study to continue (nothing was written)"
    ]
    assert (tmp_path / "README.md").read_text() == "notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]


@pytest.mark.parametrize(
    "content,problem",
    [
        (b"root:x:0:0:root:/root:/bin/bash\n", r"is not a fingerprint file: not JSON \(Expecting value"),
        (b"\xff\xfe binary", r"is not a fingerprint file: not JSON"),
        (b'{"ops": []}', r"is not a fingerprint file: JSON without the sections model \(`rlhf arithmetic --out FILE`"),
        (b"[1, 2]", r"is not a fingerprint file: JSON without the sections ops, model"),
        (None, r"cannot read fingerprint file .*: Is a directory"),
        ("missing", r"cannot read fingerprint file .*: No such file or directory"),
    ],
)
def test_a_compare_file_that_is_not_a_fingerprint_is_refused_before_measuring(
    tmp_path, content, problem, capsys, monkeypatch
):
    """`rlhf arithmetic --compare FILE`: not JSON, JSON of another shape, a folder, a missing
    path: one line naming the file and what is wrong, exit 2, and nothing measured or written."""
    import re

    from rlhf import arithmetic, cli

    def measure():
        raise AssertionError("measured although the compare file is unusable")

    monkeypatch.setattr(arithmetic, "measure", measure)
    path = tmp_path / "other.json"
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    assert cli.main(["arithmetic", "--compare", str(path), "--out", str(tmp_path / "mine.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlhf arithmetic: error: ") and str(path) in lines[0], lines
    assert re.search(problem, lines[0]), lines[0]
    assert not (tmp_path / "mine.json").exists()


def test_run_json_records_the_runtime_threads_pin_and_determinism_in_force(stopped_run):
    """What the runtime set is observable in run.json, every setting by name (written out here,
    so that a setting dropped from the record fails this test), each equal to what torch and the
    environment report now."""
    import os

    import torch

    from rlhf import runtime

    record = read_json(stopped_run.run / "run.json")
    arithmetic = record["arithmetic"]
    assert set(arithmetic) == {
        "comparable", "cpu_capability", "environment", "machine", "mkl", "mkl_branch", "mkl_sees_intel",
        "note", "overridden_user_settings", "pin", "status", "threads", "torch",
    }  # fmt: skip
    assert arithmetic["threads"] == torch.get_num_threads() == stopped_run.profile.runtime.torch_threads == 1
    assert arithmetic["environment"] == {k: os.environ.get(k) for k in runtime.PIN}
    assert arithmetic["torch"] == torch.__version__ and arithmetic["mkl_branch"] == runtime.mkl_branch_in_force()
    assert record["identity"]["arithmetic"] == runtime.identity_tag() and "threads=1" in runtime.identity_tag()
    determinism = record["determinism"]
    assert set(determinism) == {
        "applied", "overridden_user_settings", "deterministic_algorithms", "cublas_workspace_config",
        "matmul_allow_tf32", "cudnn_allow_tf32", "cudnn_deterministic", "cudnn_benchmark", "complete",
        "fill_uninitialized_memory",
    }  # fmt: skip
    assert determinism["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert determinism["fill_uninitialized_memory"] == torch.utils.deterministic.fill_uninitialized_memory
    assert determinism["cudnn_benchmark"] == torch.backends.cudnn.benchmark
    assert set(record["precision"]) == {"dtype", "force", "reason", "requested", "stored"}
    assert record["profile_values"] == json.loads(json.dumps(stopped_run.profile.to_dict()))


# ------------------------------------------------------------------------------ study and stage arguments
# Every command checks all its input before it writes or prints anything: a bad argument gets one
# `rlhf CMD: error: ...` line naming its option and a non-zero exit, and the folder is left exactly
# as it was (empty, or the study or run begun before it). The corrected command then gets past its
# checks and starts: it writes its record and reaches its first task, where these tests stop it
# (`Started`, raised by the task) instead of training.


class Started(Exception):
    """The corrected command got past its checks and reached its first task."""


def start(*args, **kwargs):
    """What a command's first task is replaced by here: it stops the command where it starts."""
    raise Started


def listing(folder) -> dict:
    """Every path under `folder` with its SHA-256 (None for a folder)."""
    from pathlib import Path

    folder = Path(folder)
    return {str(p.relative_to(folder)): sha256_file(p) if p.is_file() else None for p in sorted(folder.rglob("*"))}


def run_cli(argv: list[str]) -> int:
    from rlhf import cli

    try:
        return cli.main(argv)
    except SystemExit as stop:  # argparse's refusal of an option
        return int(stop.code or 0)


def refused(argv: list[str], option: str, capsys, folder, *first) -> str:
    """`rlhf ARGV` refused: non-zero exit, one error line naming `option`, `folder` as it was, and
    no TensorBoard line printed. Returns the error line. `first`: (module, task) of the tasks the
    command would start, each made to raise Started, so that a check that lets the input through
    fails here instead of training."""
    before = listing(folder)
    with pytest.MonkeyPatch.context() as mp:
        for module, task in first:
            mp.setattr(module, task, start)
        code = run_cli(argv)
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith(f"rlhf {argv[0]}: error: ")]
    assert code != 0 and len(errors) == 1 and option in errors[0], (code, err)
    assert "tensorboard" not in out, out
    assert listing(folder) == before
    return errors[0]


def started(argv: list[str], capsys, monkeypatch, module, task: str) -> str:
    """`rlhf ARGV` reaches `module.task` (stopped there by Started); returns what it printed."""
    monkeypatch.setattr(module, task, start)
    with pytest.raises(Started):
        run_cli(argv)
    monkeypatch.undo()
    out, err = capsys.readouterr()
    assert " error: " not in err, err
    return out


def assert_record(folder, **identity) -> None:
    """study.json holds the identity asked for and what the study ran with: commit and code."""
    from rlhf.identities import code_sha256, git_commit

    record = read_json(folder / "study.json")
    assert {k: record["identity"][k] for k in identity} == identity
    assert record["code"] == record["identity"]["code"] == code_sha256()
    assert record["commit"] == git_commit() and (record["commit"] is None or len(record["commit"]) == 40)


@pytest.mark.parametrize(
    "bad,option",
    [
        (["--study-seed", "-1"], "--study-seed"),
        (["--study-seed", str(2**64)], "--study-seed"),  # beyond what torch.manual_seed takes
        (["--study-seed", "92233720368547"], "--study-seed"),  # its runs' seeds would pass 2**63 (TOML, torch)
        (["--workers", "-1"], "--workers"),
        (["--workers", "0"], "--workers"),
        (["--n", "1"], "--n"),
    ],
)
def test_seeds_checks_every_argument_before_writing(tmp_path, bad, option, capsys, monkeypatch):
    from rlhf.events import logdir_line
    from rlhf.studies import seeds

    out = tmp_path / "study"
    out.mkdir()
    line = refused(["seeds", "--out", str(out), *bad], option, capsys, out, (seeds, "run_all"))
    assert bad[1] in line
    printed = started(["seeds", "--out", str(out), "--n", "2", "--workers", "1"], capsys, monkeypatch, seeds, "run_all")
    assert printed.splitlines()[0] == logdir_line(out)  # once the arguments are checked
    assert_record(out, n=2, study_seed=0)
    assert sorted(p.name for p in out.iterdir()) == ["seed-0", "seed-1", "study.json"]
    refused(["seeds", "--out", str(out), "--n", "2", *bad], option, capsys, out, (seeds, "run_all"))  # begun: untouched


def test_the_largest_study_seed_keeps_every_seed_of_its_runs_where_torch_and_toml_take_it():
    """derivation.max_study_seed: its last run's training seeds, plus the lab's offsets (< 1000),
    stay below 2**63 (a TOML integer, and torch's manual_seed); one study seed more leaves it."""
    from rlhf.studies import StudyError, derivation

    profile = load_profile("embedded")
    top = derivation.max_study_seed(profile)
    last = derivation.seed_changes(profile, top, derivation.MAX_RUNS - 1)
    assert max(last.values()) + derivation.RUN_STRIDE - 1 < 2**63 == derivation.SEED_LIMIT
    beyond = {k: derivation.derived_seed(derivation.profile_value(profile, *k), top + 1, 0) for k in last}
    assert max(beyond.values()) + derivation.RUN_STRIDE * derivation.MAX_RUNS > 2**63
    with pytest.raises(StudyError, match=f"--study-seed must be between 0 and {top}, not {top + 1}"):
        derivation.seed_changes(profile, top + 1, 0)


@pytest.mark.parametrize(
    "bad,option",
    [
        (["--workers", "-1"], "--workers"),
        (["--workers", "0"], "--workers"),
        (["--grid", "-1"], "--grid"),
        (["--grid", "0.05,nan"], "--grid"),
        (["--grid", "inf"], "--grid"),
        (["--grid", "1,1"], "--grid"),
        (["--grid", "0.1,0.10"], "--grid"),
        (["--grid", "0.05,abc"], "--grid"),
        (["--n", "0"], "--n"),
    ],
)
def test_frontier_checks_every_argument_before_writing(tmp_path, bad, option, capsys, monkeypatch):
    from rlhf.events import logdir_line
    from rlhf.studies.frontier import study

    out = tmp_path / "frontier"
    out.mkdir()
    refused(["frontier", "--out", str(out), *bad], option, capsys, out, (study, "run_tasks"))
    good = ["--out", str(out), "--n", "1", "--grid", "0,0.05", "--workers", "1"]
    printed = started(["frontier", *good], capsys, monkeypatch, study, "run_tasks")
    assert logdir_line(out) in printed.splitlines()
    assert_record(out, n=1, study_seed=1)
    assert [a["name"] for a in read_json(out / "study.json")["identity"]["settings"]["arms"]][1:3] == ["c0", "c0.05"]
    refused(["frontier", *good[:4], *bad], option, capsys, out, (study, "run_tasks"))  # begun: untouched


def fake_frontier_choice(out) -> None:
    """A frontier.json with a choice made on validation (what --confirm reads), no study behind it."""
    from rlhf.io import write_json
    from rlhf.studies.frontier.arms import Settings
    from rlhf.studies.frontier.study import STUDY_SEED, study_identity

    identity = study_identity("embedded", "r002", 1, "sft-e7", Settings(), STUDY_SEED)
    default = {"arm": "spec-default", "iteration": 100}
    selection = {"arm": "c0.05", "iteration": 10, "default": default}
    write_json(out / "frontier.json", {"study": identity, "selection": selection, "grid_choice": {"c": 0.05}})


@pytest.mark.parametrize("n", ["0", "-1", "1"])
def test_frontier_confirm_checks_its_seed_count_before_writing(tmp_path, n, capsys, monkeypatch):
    """`--confirm 0` is refused, not taken for "no confirmation" (which would run the study);
    one seed has no across-seed statistics."""
    from rlhf.events import logdir_line
    from rlhf.studies.frontier import confirmation, study

    out = tmp_path / "frontier"
    out.mkdir()
    fake_frontier_choice(out)
    first = [(confirmation, "run_tasks"), (study, "run_tasks")]  # the confirmation's, or the study's
    refused(["frontier", "--out", str(out), "--confirm", n], "--confirm", capsys, out, *first)
    good = ["frontier", "--out", str(out), "--confirm", "2", "--workers", "1"]
    printed = started(good, capsys, monkeypatch, confirmation, "run_tasks")
    assert logdir_line(out) in printed.splitlines()
    assert_record(out / "confirm", n=2, study_seed=2)
    refused(["frontier", "--out", str(out), "--confirm", n], "--confirm", capsys, out, *first)
    refused([*good[:-1], "0"], "--workers", capsys, out, *first)


@pytest.mark.parametrize(
    "budgets,previous,option,problem",
    [
        ("nosuch", None, "--budgets", "'nosuch'"),
        ("sft-e1,nosuch", None, "--budgets", "'nosuch'"),
        ("full", None, "--budgets", "'full'"),
        (None, b"not json at all", "--previous", "not JSON"),
        (None, b'{"identity": {"format": "rlhf-seeds-1"}, "derivation": "x"}', "--previous", "without the keys"),
        (None, b"[1, 2]", "--previous", "without the keys revision, profile_sha256, rule, command, candidates"),
        (None, "missing", "--previous", "cannot read"),
    ],
)
def test_choose_sft_budget_checks_every_argument_before_writing(
    tmp_path, budgets, previous, option, problem, capsys, monkeypatch
):
    from rlhf.studies import sft_budget

    folder = tmp_path / "b"
    folder.mkdir()
    argv = ["choose-sft-budget", "--out", str(folder / "choice.json"), "--work", str(folder / "work")]
    bad = ["--budgets", budgets] if budgets else []
    prev = tmp_path / "previous.json"
    if isinstance(previous, bytes):
        prev.write_bytes(previous)
    if previous is not None:
        bad += ["--previous", str(prev)]
    line = refused([*argv, *bad], option, capsys, folder, (sft_budget, "measure_budget"))
    assert problem in line and (previous is None or str(prev) in line), line
    started([*argv, "--budgets", "sft-e1"], capsys, monkeypatch, sft_budget, "measure_budget")
    assert (folder / "work" / "corpus" / "manifest.json").is_file() and not (folder / "choice.json").exists()
    refused([*argv, *bad], option, capsys, folder, (sft_budget, "measure_budget"))  # the work begun: untouched


@pytest.mark.parametrize(
    "stage,stop_after",
    [("sft", "0"), ("sft", "-1"), ("sft", "20"), ("judge", "2"), ("judge", "3"), ("ppo", "0"), ("ppo", "101")],
)
def test_stop_after_must_fall_inside_the_stage(tmp_path, stage, stop_after, capsys, monkeypatch):
    """--stop-after N: 1 <= N < the stage's epochs (SFT 20, the judge 2 in the embedded profile)
    or iterations (PPO 100), checked before the run folder is made."""
    run = tmp_path / "run"
    run.mkdir()
    first = (lab_stages, "ppo_fingerprints" if stage == "ppo" else "run_protocol")  # PPO's first step reads SFT's
    line = refused([stage, "--run", str(run), "--stop-after", stop_after], "--stop-after", capsys, run, first)
    assert f"not {stop_after}" in line and "--resume" in line
    started([stage, "--run", str(run), "--stop-after", "1"], capsys, monkeypatch, *first)
    assert (run / "run.json").is_file()
    refused([stage, "--run", str(run), "--stop-after", stop_after], "--stop-after", capsys, run, first)


def test_stop_on_warning_offers_its_signal_names(tmp_path, capsys, monkeypatch):
    """An unknown signal, or one without a frozen rule (it could never stop PPO), is refused by the
    option (argparse's choices, every signal with a rule listed), not by the profile file it would
    have been written into, nor after SFT and the judge have trained."""
    from rlhf import lab
    from rlhf.signals import SIGNALS, frozen_rules

    run = tmp_path / "run"
    run.mkdir()
    first = (lab, "run_lab")
    bad = ["lab", "--out", str(run), "--stop-on-warning"]
    ruled = {rule.signal for rule in frozen_rules()[0]}
    line = refused([*bad, "nosuch"], "--stop-on-warning", capsys, run, first)
    assert "'nosuch'" in line and all((s in line) == (s in ruled) for s in SIGNALS) and ".toml" not in line
    unruled = [s for s in SIGNALS if s not in ruled]
    assert unruled == ["judge_error"]  # the committed rules file defines no judge_error rule
    refused([*bad, *unruled], "--stop-on-warning", capsys, run, first)
    started(["lab", "--out", str(run), "--stop-on-warning", "kl_growth"], capsys, monkeypatch, *first)
    ppo = read_json(run / "run.json")["profile_values"]["ppo"]
    assert (ppo["stop_on_warning"], ppo["stop_signals"]) == (True, ["kl_growth"])
    refused([*bad, "kl_growth", "nosuch"], "--stop-on-warning", capsys, run, first)
