"""`rlhf export-verl`: the hand-off's contents against the lab's own roles, bad input,
and verl's own classes run on it in `.venv-verl` (tests_verl/, built by `bash setup.sh --verl`).

The session's small-budget lab run (conftest `small_run`, SMALL_BUDGET, built once per test run)
is exported once for this module; every test here shares the hand-off (one xdist group)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from rlhf.export_verl import LAB_CHAT_TEMPLATE, ROLE_FILES, ExportError, export_verl
from rlhf.verl_launch import hyperparameters, overrides

pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("export_verl")]
ROOT = Path(__file__).resolve().parents[1]
VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
VERL_CHECKS = [  # every check of tests_verl/ that must pass, by junit name
    "test_rlhf_dataset_reads_every_row_and_reproduces_lab_prompt_ids[train]",
    "test_rlhf_dataset_reads_every_row_and_reproduces_lab_prompt_ids[test]",
    "test_rlhf_dataset_reads_every_row_and_reproduces_lab_prompt_ids[probe]",
    "test_overrides_compose_with_ppo_trainer_defaults_and_pass_validate_config",
    "test_multi_gpu_overrides_pass_validate_config[2x8]",
    "test_load_reward_manager_loads_the_exported_manager",
    "test_reward_manager_scores_equal_lab_judge_including_truncated",
    "test_kl_in_reward_equals_lab_token_rewards",
    "test_gae_returns_equal_lab_and_advantages_are_whitened",
    "test_lr_schedule_differs_where_the_mapping_says",
    "test_trl_reward_trainer_reads_every_preference_pair[test]",
    "test_trl_reward_trainer_reads_every_preference_pair[train]",
    "test_trl_reward_trainer_reads_every_preference_pair[validation]",
    "test_trl_sft_trainer_reads_every_demonstration",
    "test_openrlhf_reward_dataset_reads_every_train_pair",
    "test_lab_ids_against_the_libraries",
]


@pytest.fixture(scope="module")
def small_folder(small_run):
    """The session's finished small-budget lab run on r001 (conftest `small_run`: every stage,
    the protocol's legs included), read only: tests that change a run copy it first."""
    return small_run.run


@pytest.fixture(scope="module")
def handoff(small_folder, small_profile_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("export_verl") / "handoff"
    export_verl(small_folder, out, profile=str(small_profile_file))
    return out


@pytest.fixture(scope="module")
def profile(small_profile_file):
    from rlhf.config import load_profile

    return load_profile(str(small_profile_file))


@pytest.fixture(scope="module")
def lab_tokenizer(small_folder):
    from rlhf.models import load_tokenizer

    return load_tokenizer(small_folder / "base_model")


def load_exported_reward(handoff: Path):
    """reward/lab_reward.py of the hand-off, loaded by path as verl loads it."""
    spec = importlib.util.spec_from_file_location(f"lab_reward_{id(handoff)}", handoff / "reward" / "lab_reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_rows(handoff: Path, split: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(handoff / "data" / f"{split}.parquet").to_pylist()


# ------------------------------------------------------------------ data


def test_parquet_rows_fields_and_counts(small_folder, handoff):
    from rlhf.corpus import load_corpus

    corpus = load_corpus(small_folder / "corpus")
    rows = {s: read_rows(handoff, s) for s in ("train", "test", "probe")}
    assert {s: len(r) for s, r in rows.items()} == {"train": 672, "test": 180, "probe": 20}
    for split, rs in rows.items():
        for r in rs:
            assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
            assert r["data_source"] == "officehelpprefs/r001" and r["ability"] == "office_help"
            assert len(r["prompt"]) == 1 and r["prompt"][0]["role"] == "user"
            assert {"document_id", "family", "split", "index"} <= set(r["extra_info"])
            assert set(r["reward_model"]) == {"style", "ground_truth"}
    # the prompts are the corpus's, in order, and only the held-out rows carry a label
    want = [p["prompt"] for p in corpus.learning_view().rollout_prompts()]
    assert [r["prompt"][0]["content"] for r in rows["train"]] == want
    assert all(r["reward_model"]["ground_truth"] == "" for r in rows["train"])
    assert {r["extra_info"]["split"] for r in rows["train"]} == {"train"}
    labels = {lab["document_id"]: lab["action"] for lab in corpus.evaluation_view().labels("pair", "test")}
    assert all(r["reward_model"]["ground_truth"] == str(labels[r["extra_info"]["document_id"]]) for r in rows["test"])
    assert [r["reward_model"]["ground_truth"] for r in rows["probe"]] == [str(k % 6) for k in range(20)]
    assert len({r["prompt"][0]["content"] for r in rows["train"] + rows["test"] + rows["probe"]}) == 872


def test_chat_template_reproduces_lab_prompt_ids_on_every_row(handoff, lab_tokenizer, profile):
    """The exported tokenizer's chat template renders rlhf.tokens.chat_prompt exactly: the same
    ids on all 872 rows (the verl venv repeats this with verl's own rollout tokenizer path)."""
    from transformers import AutoTokenizer

    from rlhf.tokens import encode_prompt

    tok = AutoTokenizer.from_pretrained(str(handoff / "models" / "actor"), local_files_only=True)
    assert tok.chat_template == LAB_CHAT_TEMPLATE
    for split in ("train", "test", "probe"):
        for r in read_rows(handoff, split):
            got = tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
            assert list(got) == encode_prompt(lab_tokenizer, r["prompt"][0]["content"], profile.limits)


def test_generation_stops_on_the_lab_eos_only(handoff, lab_tokenizer):
    eos = lab_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for folder in ("actor", "critic", "judge"):
        assert json.loads((handoff / "models" / folder / "config.json").read_text())["eos_token_id"] == eos
    gen = json.loads((handoff / "models" / "actor" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == eos  # one id, not a list: PAD never stops a response


# ------------------------------------------------------------------ models against the lab's roles


def _batch(tokenizer, profile, n=6):
    from rlhf.corpus import Corpus
    from rlhf.tokens import collate, encode_example

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pairs = Corpus.build("r001").evaluation_view().test_pairs()[:n]
    ex = [
        encode_example(tokenizer, p["prompt"], p["chosen" if i % 2 else "rejected"], eos, profile.limits)
        for i, p in enumerate(pairs)
    ]
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return collate([p for p, _ in ex], [r for _, r in ex], pad, padding_side="right")


def _lab_role(kind, profile, run, rel, **kw):
    from rlhf.roles import load_role, new_role

    role = new_role(kind, profile, run / "base_model")
    load_role(role, run / rel, **kw)
    return role


def test_merged_actor_logits_equal_the_lab_sft_actor(small_folder, handoff, profile, lab_tokenizer):
    from transformers import Qwen2ForCausalLM

    batch = _batch(lab_tokenizer, profile)
    lab = _lab_role("actor", profile, small_folder, ROLE_FILES["sft"])
    merged = Qwen2ForCausalLM.from_pretrained(str(handoff / "models" / "actor"), dtype=torch.float32).eval()
    with torch.no_grad():
        kw = dict(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), position_ids=batch.position_ids
        )
        want, got = lab.model(**kw).logits, merged(**kw).logits
    m = batch.attention_mask
    diff = (want[m] - got[m]).abs().max().item()
    assert diff < 1e-3, f"merged actor logits differ from the lab's LoRA actor by {diff:.3g}"


def test_critic_initialisation_equals_the_lab_critic(small_folder, handoff, profile, lab_tokenizer):
    """Backbone = SFT adapters merged, value head zero: the lab critic's values (all 0) and hidden states."""
    from transformers import Qwen2ForTokenClassification

    from rlhf.roles import critic_values
    from rlhf.scoring import backbone_hidden

    batch = _batch(lab_tokenizer, profile)
    lab = _lab_role("critic", profile, small_folder, ROLE_FILES["sft"], source_kind="actor", adapters_only=True)
    exported = Qwen2ForTokenClassification.from_pretrained(
        str(handoff / "models" / "critic"), dtype=torch.float32
    ).eval()
    assert exported.config.num_labels == 1
    with torch.no_grad():
        want_h = backbone_hidden(lab.model, batch)
        got_h = exported.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), position_ids=batch.position_ids
        ).last_hidden_state
        values = exported(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), position_ids=batch.position_ids
        ).logits[..., 0]
    m = batch.attention_mask
    assert (want_h[m] - got_h[m]).abs().max().item() < 1e-3
    assert torch.equal(values[m], torch.zeros_like(values[m])) and torch.equal(
        critic_values(lab, batch), torch.zeros_like(batch.response_mask, dtype=torch.float32)
    )


def judge_cases(small_folder, profile, tokenizer, n=8) -> list[dict]:
    """Fixed (prompt, answer) pairs scored by the lab's judge role: test-pair answers with EOS,
    the same answers cut without EOS (truncated: the -1 penalty applies), and two with a token
    fault (a control token; a byte that is not UTF-8), each with its finish reason as the lab
    decodes it."""
    from conftest import rollout_rewards
    from rlhf import rubric
    from rlhf.corpus import Corpus
    from rlhf.roles import reward_scores
    from rlhf.tokens import collate, decode_response, encode_example

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    view = Corpus.build("r001").evaluation_view()
    judge = _lab_role("judge", profile, small_folder, ROLE_FILES["judge"])
    cases = []
    for i, pair in enumerate(view.test_pairs()[:n]):
        p, r = encode_example(tokenizer, pair["prompt"], pair["chosen" if i % 2 else "rejected"], eos, profile.limits)
        truncated = i % 3 == 2
        if truncated:
            r = r[:-1][: max(1, len(r) // 2)]  # cut, no EOS
        if i == n - 2:  # a control token inside the answer, EOS kept
            r = r[:2] + [tokenizer.convert_tokens_to_ids("<|im_start|>")] + r[2:]
        if i == n - 1 and not truncated:  # a byte that is not UTF-8 by itself, before EOS
            r = r[:-1] + [next(k for k in range(len(tokenizer)) if tokenizer.decode([k]) == "\ufffd"), eos]
        action = view.label(pair["document_id"])["action"]
        text, reason = decode_response(tokenizer, r, eos)
        cases.append(
            {
                "prompt_ids": p,
                "response_ids": r,
                "truncated": truncated,
                "finish_reason": reason,
                "ground_truth": str(action),
                "rubric_success": rubric.evaluate(text, reason, action)["rubric_success"],
            }
        )
    assert {c["finish_reason"] for c in cases} == {"eos", "length", "control_token", "broken_text"}
    batch = collate([c["prompt_ids"] for c in cases], [c["response_ids"] for c in cases], pad, padding_side="right")
    with torch.no_grad():
        scores = reward_scores(judge, batch)
    zeros = torch.zeros(batch.response_mask.shape)
    trunc = torch.tensor([c["truncated"] for c in cases])
    # the lab's terminal reward: token_rewards with a zero log-ratio leaves score - 1[truncated] at the last token
    terminal = rollout_rewards(
        zeros,
        zeros,
        scores,
        batch.response_mask,
        trunc,
        kl_coef=profile.ppo.kl_coef,
        truncation_penalty=profile.ppo.truncation_penalty,
    ).sum(1)
    for c, s, t in zip(cases, scores.tolist(), terminal.tolist()):
        c["lab_score"], c["lab_terminal"] = s, t
    return cases


def test_exported_judge_and_reward_equal_the_lab_judge(small_folder, handoff, profile, lab_tokenizer):
    """The reward module's judge (exported Qwen2ForSequenceClassification + bias) and its
    reward (score, -1 when cut without EOS) equal the lab's judge role on fixed pairs."""
    cases = judge_cases(small_folder, profile, lab_tokenizer)
    reward = load_exported_reward(handoff)
    for c in cases:
        out = reward.lab_reward(c["prompt_ids"], c["response_ids"])
        assert abs(out["judge_score"] - c["lab_score"]) < 1e-4, (out, c["lab_score"])
        assert abs(out["reward"] - c["lab_terminal"]) < 1e-4
        assert out["truncated"] == float(c["truncated"])
    assert {c["truncated"] for c in cases} == {True, False}


def test_compute_score_is_the_lab_rubric(handoff):
    from rlhf import rubric

    reward = load_exported_reward(handoff)
    text = rubric.render(2, 1, True)
    cases = [("eos", 2), ("length", 2), ("eos", 3), *((fault, 2) for fault in rubric.TOKEN_FAULTS)]
    for reason, action in cases:
        got = reward.compute_score("officehelpprefs/r001", text, str(action), {"finish_reason": reason})
        assert got["score"] == float(rubric.evaluate(text, reason, action)["rubric_success"])
        assert got["score"] == float(reason == "eos" and action == 2)  # a rendering of action 2, hedged
    with pytest.raises(ValueError, match="finish_reason"):
        reward.compute_score("officehelpprefs/r001", text, "2", {})
    with pytest.raises(ValueError, match="no ground truth"):
        reward.compute_score("officehelpprefs/r001", text, "", {"finish_reason": "eos"})


def test_the_reward_module_names_every_finish_reason_as_the_lab_does(embedded_base):
    """rlhf/verl_handoff/lab_reward.py (self-contained, so it decodes on its own) against
    rlhf.tokens.decode_response on crafted ids of the embedded tokenizer, one or more per
    reason, faults combined; its indicators name each reason once; the truncation penalty reads
    the ending only."""
    from rlhf import rubric
    from rlhf.export_verl import HANDOFF_DIR
    from rlhf.tokens import decode_response

    spec = importlib.util.spec_from_file_location("lab_reward_source", HANDOFF_DIR / "lab_reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    reward._CACHE["rubric"] = rubric  # the vendored lab_rubric.py is rlhf/rubric.py (checked above)
    tokenizer, eos = embedded_base.tokenizer, embedded_base.eos_id
    body = tokenizer("Save the document.", add_special_tokens=False)["input_ids"]
    oov, control = len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_start|>")
    lone = next(i for i in range(len(tokenizer)) if tokenizer.decode([i]) == "\ufffd")
    cases = {
        "eos": [body + [eos], [eos]],
        "length": [body, []],
        "control_token": [body[:1] + [control] + body[1:] + [eos], body + [eos, eos], [lone, control]],
        "broken_text": [body + [lone, eos], [lone]],
        "out_of_vocabulary": [body + [oov, eos], [control, lone, oov], [-1]],
    }
    assert tuple(cases) == rubric.FINISH_REASONS
    for reason, examples in cases.items():
        for ids in examples:
            got = reward.decode_response(tokenizer, ids, eos)
            assert got == decode_response(tokenizer, ids, eos) and got[1] == reason, (reason, ids, got)
            flags = reward.finish_indicators(reason)
            assert flags == {f"finish_{r}": float(r == reason) for r in rubric.FINISH_REASONS}
            assert reward.cut_without_eos(ids, eos) == (not ids or ids[-1] != eos)
    with pytest.raises(ValueError, match="unknown finish reason 'undecodable'"):
        reward.finish_indicators("undecodable")


def test_vendored_rubric_is_rlhf_rubric_and_imports_nothing_from_rlhf(handoff):
    vendored = handoff / "reward" / "lab_rubric.py"
    assert vendored.read_text() == (ROOT / "rlhf" / "rubric.py").read_text()
    for path in (vendored, handoff / "reward" / "lab_reward.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "rlhf" or n.startswith("rlhf.") for n in names), f"{path.name} imports {names}"


def test_manifest_hashes_every_file_and_the_source(small_folder, handoff):
    from rlhf.io import sha256_file

    manifest = json.loads((handoff / "manifest.json").read_text())
    files = {str(p.relative_to(handoff)) for p in handoff.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == files
    assert all(sha256_file(handoff / rel) == h for rel, h in manifest["files"].items())
    assert manifest["role_files"]["judge"] == sha256_file(small_folder / ROLE_FILES["judge"])
    assert manifest["versions"]["verl"] == "0.9.1" and manifest["run_identity"]["revision"] == "r001"
    launch = (handoff / "launch" / "launch.sh").read_text()
    assert (
        "verl.trainer.main_ppo" in launch and "SEEDS" in launch and os.access(handoff / "launch" / "launch.sh", os.X_OK)
    )


# ------------------------------------------------------------------ mapping and overrides


def test_overrides_map_the_lab_hyperparameters(profile):
    one = overrides(profile, 1, 1)
    for line in (
        "data.train_batch_size=4",
        "algorithm.lam=0.95",
        "algorithm.kl_ctrl.kl_coef=0.02",
        "actor_rollout_ref.actor.ppo_epochs=2",
        "trainer.total_training_steps=4",
        f"actor_rollout_ref.actor.optim.lr={profile.ppo.actor_lr}",
        "data.max_response_length=64",
    ):
        assert line in one, line
    rows = {r["hyperparameter"]: r for r in hyperparameters(profile, 16)}
    assert rows["ppo.prompts_per_iteration"]["status"] == "approximate"
    assert "data.train_batch_size=16" in overrides(profile, 2, 8)
    assert {r["status"] for r in rows.values()} == {"exact", "approximate", "not expressible"}


def test_docs_mapping_table_lists_every_hyperparameter_with_its_status(profile):
    """docs/scaling-out.md's lab -> verl mapping table has a row, with its status, for every
    hyperparameter the exporter maps."""
    doc = (ROOT / "docs" / "scaling-out.md").read_text()
    table = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 4:
            table[cells[0].strip("`")] = cells
    for row in hyperparameters(profile, 1):
        assert row["hyperparameter"] in table, f"docs/scaling-out.md mapping table has no row {row['hyperparameter']}"
        assert row["status"] in table[row["hyperparameter"]][3], row["hyperparameter"]


# ------------------------------------------------------------------ bad input: nothing written


def _light_copy(run: Path, dest: Path) -> Path:
    """run.json, corpus/ and the role sidecars: all check_run reads."""
    shutil.copytree(run / "corpus", dest / "corpus")
    shutil.copy(run / "run.json", dest / "run.json")
    for rel in ROLE_FILES.values():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(run / f"{rel}.json", dest / f"{rel}.json")
    return dest


def test_existing_output_folder_is_refused(small_folder, tmp_path, small_profile_file):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="exists"):
        export_verl(small_folder, out, profile=str(small_profile_file))
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_unfinished_run_is_refused_and_nothing_written(small_folder, tmp_path, small_profile_file):
    run = _light_copy(small_folder, tmp_path / "run")
    record = json.loads((run / "run.json").read_text())
    del record["stages"]["ppo"]
    (run / "run.json").write_text(json.dumps(record))
    with pytest.raises(ExportError, match="unfinished.*ppo"):
        export_verl(run, tmp_path / "out", profile=str(small_profile_file))
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_r001_r002_mix_is_refused_and_nothing_written(small_folder, tmp_path, small_profile_file):
    run = _light_copy(small_folder, tmp_path / "run")
    side = run / f"{ROLE_FILES['judge']}.json"
    meta = json.loads(side.read_text())
    meta["identity"]["revision"] = "r002"
    meta["identity"]["corpus"] = "0" * 64
    side.write_text(json.dumps(meta))
    with pytest.raises(ExportError, match="mixes revisions"):
        export_verl(run, tmp_path / "out", profile=str(small_profile_file))
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_failure_mid_export_leaves_no_folder(small_folder, tmp_path, small_profile_file, monkeypatch):
    from rlhf import export_verl as mod

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(mod, "write_models", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        export_verl(small_folder, tmp_path / "out", profile=str(small_profile_file))
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ verl's own classes (.venv-verl)


def lab_config_values(profile) -> dict:
    """verl config keys and the lab's numbers, read from the profile (not from the exporter)."""
    ppo, optim, limits = profile.ppo, profile.optim, profile.limits
    A, C = "actor_rollout_ref.actor", "critic"
    return {
        "data.max_prompt_length": limits.prompt_tokens,
        "data.max_response_length": limits.response_tokens,
        "data.train_batch_size": ppo.prompts_per_iteration,
        "actor_rollout_ref.rollout.n": 1,
        "actor_rollout_ref.rollout.temperature": ppo.temperature,
        "actor_rollout_ref.rollout.top_k": -1,
        "actor_rollout_ref.rollout.top_p": 1.0,
        f"{A}.ppo_mini_batch_size": ppo.prompts_per_iteration,
        f"{A}.ppo_epochs": ppo.updates_per_iteration,
        f"{C}.ppo_epochs": ppo.updates_per_iteration,
        "trainer.total_training_steps": ppo.iterations,
        "algorithm.kl_ctrl.kl_coef": ppo.kl_coef,
        "algorithm.kl_penalty": "kl",
        "algorithm.gamma": ppo.gamma,
        "algorithm.lam": ppo.lam,
        "algorithm.adv_estimator": "gae",
        f"{A}.use_kl_loss": False,
        f"{A}.clip_ratio": ppo.clip,
        f"{A}.entropy_coeff": 0,
        f"{A}.optim.lr": ppo.actor_lr,
        f"{C}.optim.lr": ppo.critic_lr,
        f"{A}.optim.weight_decay": optim.weight_decay,
        f"{C}.optim.weight_decay": optim.weight_decay,
        f"{A}.grad_clip": optim.grad_clip_norm,
        f"{C}.grad_clip": optim.grad_clip_norm,
        f"{A}.optim.min_lr_ratio": optim.min_lr_ratio,
        f"{A}.optim.lr_warmup_steps_ratio": optim.warmup_ratio,
        "actor_rollout_ref.model.lora_rank": profile.lora.rank,
        "actor_rollout_ref.model.lora_alpha": profile.lora.alpha,
    }


def expectations(small_folder, handoff, profile, tokenizer) -> dict:
    """The lab's side of every verl check, computed with rlhf (the verl venv has no rlhf)."""
    from conftest import rollout_rewards
    from rlhf.masks import last_active_index
    from rlhf.ppo_math import gae, learning_rate
    from rlhf.tokens import encode_example, encode_prompt

    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt_ids = {
        s: [encode_prompt(tokenizer, r["prompt"][0]["content"], profile.limits) for r in read_rows(handoff, s)]
        for s in ("train", "test", "probe")
    }
    g = torch.Generator().manual_seed(16)
    B, T = 4, 12
    lengths = torch.tensor([12, 7, 3, 9])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [B, T] right-padded
    logp_old = -torch.rand(B, T, generator=g) * 3
    logp_ref = -torch.rand(B, T, generator=g) * 3
    score = torch.randn(B, generator=g)
    truncated = torch.tensor([True, False, False, True])
    values = torch.randn(B, T, generator=g) * mask
    ppo = profile.ppo
    rewards = rollout_rewards(
        logp_old, logp_ref, score, mask, truncated, kl_coef=ppo.kl_coef, truncation_penalty=ppo.truncation_penalty
    )
    dones = torch.zeros(B, T, dtype=torch.bool)
    dones[torch.arange(B), last_active_index(mask)] = True
    adv, ret = gae(rewards, values, dones, gamma=ppo.gamma, lam=ppo.lam)
    # The schedule at the contract's size (100 iterations, 200 updates), not the small budget's 4.
    from rlhf.config import load_profile

    iterations = load_profile("embedded").ppo.iterations
    total = iterations * ppo.updates_per_iteration
    optim = profile.optim
    return {
        "seeds": dataclasses.asdict(profile.seeds),
        "pad_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "prompt_ids": prompt_ids,
        "pair_ids": [
            sum(encode_example(tokenizer, r["prompt"], r["chosen"], eos, profile.limits), [])
            for r in map(json.loads, (handoff / "data" / "preference_pairs" / "train.jsonl").read_text().splitlines())
        ],
        "judge_cases": judge_cases(small_folder, profile, tokenizer),
        "overrides": {"2x8": overrides(profile, 2, 8)},
        "config_values": lab_config_values(profile),
        "ppo_case": {
            "mask": mask.float().tolist(),
            "logp_old": logp_old.tolist(),
            "logp_ref": logp_ref.tolist(),
            "terminal": (score - truncated.float()).tolist(),
            "kl_coef": ppo.kl_coef,
            "token_rewards": rewards.tolist(),
            "values": values.tolist(),
            "gamma": ppo.gamma,
            "lam": ppo.lam,
            "advantages": adv.tolist(),
            "returns": ret.tolist(),
        },
        "schedule": {
            "peak": ppo.actor_lr,
            "iterations": iterations,
            "warmup_ratio": optim.warmup_ratio,
            "min_lr_ratio": optim.min_lr_ratio,
            "lab_lr_per_update": [
                learning_rate(s, total, ppo.actor_lr, optim.warmup_ratio, optim.min_lr_ratio) for s in range(total)
            ],
        },
    }


def test_main_suite_never_collects_the_verl_checks():
    """tests_verl/ imports verl (absent here): the lab's suite leaves it out, by path and by recursion."""
    import configparser

    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    assert "tests_verl" not in ini["pytest"]["testpaths"].split()
    assert "tests_verl" in ini["pytest"]["norecursedirs"].split()
    assert (ROOT / "tests_verl" / "pytest.ini").is_file()  # its own rootdir: the lab's conftest is not loaded


def test_verl_checks_pass_in_the_verl_venv(small_folder, handoff, profile, lab_tokenizer, tmp_path, record_result):
    """Builds .venv-verl when missing (bash setup.sh --verl), runs tests_verl/ there on this
    hand-off, and requires every named check to have passed (junit report)."""
    t0 = time.perf_counter()
    subprocess.run(["bash", str(ROOT / "setup.sh"), "--verl"], cwd=ROOT, check=True)
    setup_s = time.perf_counter() - t0
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps(expectations(small_folder, handoff, profile, lab_tokenizer)))
    junit = tmp_path / "verl-junit.xml"
    env = {
        **os.environ,
        "RLHF_VERL_HANDOFF": str(handoff),
        "RLHF_VERL_EXPECT": str(expect),
        "HOME": str(tmp_path),
        "RAY_DISABLE_IMPORT_WARNING": "1",
    }
    t1 = time.perf_counter()
    proc = subprocess.run(
        [
            str(VERL_PY),
            "-m",
            "pytest",
            "-c",
            str(ROOT / "tests_verl" / "pytest.ini"),
            str(ROOT / "tests_verl"),
            "-q",
            f"--junitxml={junit}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    checks_s = time.perf_counter() - t1
    record_result("verl_venv_setup_seconds", round(setup_s, 1))
    record_result("verl_checks_seconds", round(checks_s, 1))
    assert junit.is_file(), f"the verl checks did not run:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    outcome = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        outcome[case.get("name")] = bad[0] if bad else "passed"
    record_result("verl_checks", outcome)
    failed = {k: v for k, v in outcome.items() if v != "passed"}
    assert not failed, f"verl checks not passed: {failed}\n{proc.stdout[-6000:]}"
    missing = [name for name in VERL_CHECKS if name not in outcome]
    assert not missing, f"verl checks that did not run: {missing}"
    assert proc.returncode == 0
