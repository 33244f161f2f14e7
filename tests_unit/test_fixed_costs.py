"""What a stage pays beyond its arithmetic (rlhf.costs), and the code that keeps it small:

* the frozen base is read from its folder once per process and copied for each role
  (rlhf.models.kept_base); each copy is its own storage, bit for bit the base;
* a frozen base is hashed once per process: a copy proves itself equal to the base it was copied
  from, tensor by tensor and bit by bit, and inherits its hashes (rlhf.roles.inherit_frozen_hashes);
* checkpoints are written by a background writer (rlhf.checkpoint.StateWriter): the same bytes as
  a direct save, a snapshot taken when asked, errors handed back, a kill mid-write leaving only
  debris a rerun sweeps.

The counts each stage records in its timings.json are recomputed from a lab's own folder in
tests_reproducibility/test_resume_small.py.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlhf import costs, models
from rlhf.checkpoint import StateWriter, load_state, save_state
from rlhf.io import ArtifactExists, read_json, sha256_file, sweep_incomplete
from rlhf.roles import (
    RoleIsolationError,
    assert_role_isolation,
    fingerprint,
    inherit_frozen_hashes,
    manifest_sha256,
    new_role,
    same_bits,
    tensor_sha256,
)

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

KINDS = ("actor", "reference", "judge", "critic")


@pytest.fixture
def fresh_process_costs(monkeypatch):
    """As in a fresh process: no base kept yet (the counts are read as differences)."""
    monkeypatch.setattr(models, "_KEPT", {})


def test_four_roles_read_the_folder_once_and_hash_the_base_once(fresh_process_costs, embedded_profile, embedded_dir):
    """Catches a base read from the folder for every role, a copy that shares the base's storage,
    and a frozen base hashed again for every role (or a remembered hash that is wrong)."""
    start = costs.snapshot()
    roles = {kind: new_role(kind, embedded_profile, embedded_dir) for kind in KINDS}
    paid = costs.since(start)
    assert (paid["base_loads"], paid["role_builds"]) == (1, 4)
    roles["judge"].freeze()  # as PPO holds it (a fresh judge still learns)
    assert_role_isolation(roles)  # four copies, four storages (and none is the kept base)
    kept = next(iter(models._KEPT.values()))
    kept_storages = {p.untyped_storage().data_ptr() for p in kept.parameters()}
    for role in roles.values():
        assert kept_storages.isdisjoint(p.untyped_storage().data_ptr() for p in role.model.parameters())

    start = costs.snapshot()
    prints = {kind: fingerprint(role) for kind, role in roles.items()}
    assert costs.since(start)["base_hashes"] == 0  # the base was hashed once, when the first copy was made
    # Recomputed without any remembered hash: SHA-256 of every frozen tensor's bytes.
    for kind, role in roles.items():
        direct = {name: tensor_sha256(t) for name, t in sorted(role.frozen_named_tensors(), key=lambda kv: kv[0])}
        assert prints[kind]["frozen"] == direct, kind
        assert prints[kind]["frozen_sha256"] == manifest_sha256(direct)
    assert len({fp["frozen_sha256"] for fp in prints.values()}) == 1


def test_another_base_replaces_the_kept_one_and_is_read_once(fresh_process_costs, embedded_dir):
    """A base is what makes its tensors (file hashes, dtype, device, token count): another one is
    read once and kept instead of the first (one base in memory at a time)."""
    files = models.directory_identity(embedded_dir)
    start = costs.snapshot()
    first = models.kept_base(embedded_dir, files, "float32", "cpu", 958)
    assert models.kept_base(embedded_dir, dict(files), "float32", "cpu", 958) is first
    other = models.kept_base(embedded_dir, {**files, "extra.bin": "0" * 64}, "float32", "cpu", 958)
    assert other is not first and len(models._KEPT) == 1
    assert models.kept_base(embedded_dir, files, "float32", "cpu", 958) is not first  # read again
    assert costs.since(start)["base_loads"] == 3


def test_a_role_copied_from_the_kept_base_equals_one_read_from_the_folder(
    fresh_process_costs, embedded_profile, embedded_dir
):
    """Every tensor bit for bit, and the same logits: the golden lab's bytes rest on it."""
    from transformers import Qwen2ForCausalLM

    copied = models.load_base(embedded_profile, embedded_dir).model
    read = Qwen2ForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32, local_files_only=True).eval()
    ours, theirs = dict(copied.state_dict()), dict(read.state_dict())
    assert ours.keys() == theirs.keys()
    assert all(same_bits(ours[k], theirs[k]) for k in ours)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    with torch.no_grad():
        assert same_bits(copied(input_ids=ids).logits, read(input_ids=ids).logits)


def test_a_copy_that_differs_from_its_base_is_refused_naming_the_tensor(
    fresh_process_costs, embedded_profile, embedded_dir
):
    """Catches a copy that inherits the base's hashes without being compared with it."""
    models.load_base(embedded_profile, embedded_dir)
    kept = next(iter(models._KEPT.values()))
    tampered = copy.deepcopy(kept)
    with torch.no_grad():
        tampered.model.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
    with pytest.raises(RoleIsolationError, match=r"model\.layers\.0\.mlp\.up_proj\.weight"):
        inherit_frozen_hashes(kept, tampered)
    n_tensors = len(list(kept.parameters())) + len(list(kept.buffers()))
    assert inherit_frozen_hashes(kept, copy.deepcopy(kept)) == n_tensors


def test_same_bits_is_sha256_equality():
    """same_bits agrees with tensor_sha256 where == does not: signed zeros, NaNs, dtype, shape."""
    a = torch.tensor([0.0, 1.5, float("nan")])
    cases = [
        (a, a.clone(), True),
        (a, torch.tensor([-0.0, 1.5, float("nan")]), False),
        (a, a.double(), False),
        (a.to(torch.bfloat16), a.to(torch.bfloat16).clone(), True),
        (torch.zeros(2, 3), torch.zeros(3, 2), False),
        (torch.tensor([True, False]), torch.tensor([True, False]), True),
    ]
    for x, y, equal in cases:
        assert same_bits(x, y) is equal
        assert (tensor_sha256(x) == tensor_sha256(y)) is equal


# ------------------------------------------------------------------------ the background writer


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "step": seed, "history": {"loss": [0.5, 0.25]}}


def test_the_writer_writes_the_bytes_a_direct_save_writes(tmp_path):
    writer = StateWriter()
    state = _state(1)
    writer.save(tmp_path / "bg.pt.gz", state, {"run": "x"})
    save_state(tmp_path / "direct.pt.gz", state, {"run": "x"})
    writer.wait()
    assert sha256_file(tmp_path / "bg.pt.gz") == sha256_file(tmp_path / "direct.pt.gz")
    bg, direct = read_json(tmp_path / "bg.pt.gz.json"), read_json(tmp_path / "direct.pt.gz.json")
    assert (bg["sha256"], bg["identity"]) == (direct["sha256"], direct["identity"])


def test_the_writer_saves_the_state_as_it_was_when_asked(tmp_path):
    """Training goes on while the checkpoint is written: what it changes after `save` (tensors in
    place, the history) must not reach the file."""
    writer = StateWriter()
    state = _state(2)
    before = {"w": state["w"].clone(), "history": copy.deepcopy(state["history"])}
    writer.save(tmp_path / "ck.pt.gz", state, {})
    state["w"].mul_(-3.0)
    state["history"]["loss"].append(9.0)
    writer.wait()
    got = load_state(tmp_path / "ck.pt.gz")
    assert same_bits(got["w"], before["w"]) and got["history"] == before["history"]


def test_a_failed_background_write_is_raised_at_the_next_save_or_wait(tmp_path):
    writer = StateWriter()
    save_state(tmp_path / "taken.pt.gz", _state(3), {})
    writer.save(tmp_path / "taken.pt.gz", _state(4), {})  # would overwrite: refused in the thread
    with pytest.raises(ArtifactExists, match="taken.pt.gz"):
        writer.wait()
    writer.wait()  # reported once
    writer.save(tmp_path / "taken.pt.gz", _state(4), {})
    with pytest.raises(ArtifactExists):
        writer.save(tmp_path / "next.pt.gz", _state(5), {})  # the next save waits and reports it
    assert not (tmp_path / "next.pt.gz").exists()
    writer.save(tmp_path / "taken.pt.gz", _state(4), {})
    writer.abandon()  # a leg ending on an error of its own: the write's error is not raised
    writer.wait()


def test_saves_and_waits_are_counted(tmp_path):
    start = costs.snapshot()
    writer = StateWriter()
    for i in range(3):
        writer.save(tmp_path / f"ck-{i}.pt.gz", _state(i), {})
    writer.wait()
    save_state(tmp_path / "final.pt.gz", _state(9), {})
    paid = costs.since(start)
    assert paid["state_saves"] == 4 and paid["save_wait_s"] >= 0


CRASHING_WRITER = textwrap.dedent(
    """
    import sys, time
    import torch
    import rlhf
    from rlhf.checkpoint import StateWriter
    from rlhf.io import crash_point
    folder = sys.argv[1]
    writer = StateWriter()
    writer.save(folder + "/ck-1.pt.gz", {"w": torch.ones(4096, 64)}, {})
    writer.save(folder + "/ck-2.pt.gz", {"w": torch.zeros(4096, 64)}, {})
    crash_point("train.step")   # training goes on meanwhile; killed here when asked
    writer.wait()
    print("finished")
    """
)


@pytest.mark.parametrize(
    "crash_at, landed",
    [
        ("write:ck-2.pt.gz", ["ck-1.pt.gz"]),  # killed in the writer's thread, mid-write: ck-2 lost
        ("train.step", ["ck-1.pt.gz", "ck-2.pt.gz"]),  # killed in training: the write in flight lands first
    ],
)
def test_a_kill_loses_at_most_the_checkpoint_being_written(tmp_path, crash_at, landed):
    env = {k: v for k, v in os.environ.items() if k != "RLHF_CRASH_AT"}
    done = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(tmp_path)],
        env={**env, "RLHF_CRASH_AT": crash_at},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -9 and "finished" not in done.stdout, done.stderr[-2000:]
    sweep_incomplete(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.pt.gz")) == landed
    for name in landed:
        load_state(tmp_path / name)  # whole, hash-checked
    assert not list(tmp_path.glob(".*"))  # the half-written temporary file was debris, now swept


def test_a_phase_records_its_block_s_seconds_after_its_sync():
    import time

    from rlhf import costs

    seconds: dict = {}
    order: list[str] = []
    with costs.phase(seconds, "generation", sync=lambda: order.append("sync")):
        time.sleep(0.02)
        order.append("block")
    assert order == ["block", "sync"] and 0.02 <= seconds["generation"] < 5
    with costs.phase(seconds, "judge"):  # no device to wait for
        order.append("judge block")
    assert (
        order[-1] == "judge block"
        and set(seconds) == {"generation", "judge"}
        and seconds["judge"] < seconds["generation"]
    )
