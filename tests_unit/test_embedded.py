"""The embedded base: deterministic build, committed hashes, no lab text, Qwen2 code path."""

from pathlib import Path

import pytest
import torch

from rlhf import embedded
from rlhf.io import ArtifactExists, read_json

pytestmark = pytest.mark.unit

EXPECTED = Path(embedded.__file__).parent / "embedded_expected.json"


def test_two_builds_with_the_same_seed_are_bit_identical(tmp_path, embedded_dir):
    again = tmp_path / "again"
    embedded.build_embedded(again)
    for name, digest in read_json(embedded_dir / "manifest.json")["files"].items():
        assert read_json(again / "manifest.json")["files"][name] == digest, name
    assert (again / "model.safetensors").read_bytes() == (embedded_dir / "model.safetensors").read_bytes()


def test_build_matches_the_committed_manifest(embedded_dir, record_result):
    """CI checks the build against the hashes committed beside the builder."""
    expected = read_json(EXPECTED)
    built = read_json(embedded_dir / "manifest.json")
    record_result("embedded_parameters", built["parameters"])
    assert built["files"] == expected["files"]
    assert built["parameters"] == expected["parameters"]


def test_a_different_seed_gives_different_weights(tmp_path, embedded_dir):
    other = tmp_path / "seed50"
    embedded.build_embedded(other, seed=50, audit=False)
    assert (other / "model.safetensors").read_bytes() != (embedded_dir / "model.safetensors").read_bytes()


def test_build_refuses_to_overwrite(embedded_dir):
    before = (embedded_dir / "model.safetensors").read_bytes()
    with pytest.raises(ArtifactExists, match="refusing to overwrite"):
        embedded.build_embedded(embedded_dir)
    assert (embedded_dir / "model.safetensors").read_bytes() == before


def test_build_text_contains_no_lab_prompt_response_or_probe():
    strings = embedded.lab_strings()
    assert len(strings) > 2000  # prompts, responses, contexts, probes are all in the list
    text = embedded.tokenizer_training_text()
    embedded.audit_training_text(text, strings)  # raises on a leak


def test_the_audit_catches_a_leaked_lab_string():
    strings = embedded.lab_strings()
    leaked = embedded.tokenizer_training_text() + strings[17] + "\n"
    with pytest.raises(ValueError, match="lab strings occur"):
        embedded.audit_training_text(leaked, strings)


def test_same_class_and_code_path_as_qwen(embedded_base):
    from transformers import Qwen2ForCausalLM

    model = embedded_base.model
    assert type(model) is Qwen2ForCausalLM
    cfg = model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.all(model.model.norm.weight == embedded.FINAL_NORM_GAIN)
    assert all(not p.requires_grad for p in model.parameters())
    assert not model.training


def test_tokenizer_round_trips_lab_text_and_keeps_prompts_short(embedded_base):
    from rlhf.corpus import build_corpus
    from rlhf.embedded import corpus_records
    from rlhf.tokens import chat_prompt

    tok = embedded_base.tokenizer
    longest = 0
    for rec in corpus_records(build_corpus()):
        ids = tok(chat_prompt(rec["prompt"]), add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == chat_prompt(rec["prompt"])
        longest = max(longest, len(ids))
    assert longest <= 256


def test_lab_strings_cover_both_corpus_revisions():
    from rlhf.corpus import build_corpus

    strings = set(embedded.lab_strings())
    for revision in ("r001", "r002"):
        prompts = {r["prompt"] for r in embedded.corpus_records(build_corpus(revision))}
        assert prompts <= strings, revision


def test_control_text_pairs_each_situation_with_an_independent_fix():
    office = embedded.tokenizer_training_text().splitlines()
    control = embedded.tokenizer_training_text(text="control").splitlines()
    assert len(office) == len(control)
    assert all(c.startswith(o) for o, c in zip(office, control))  # the same first stream
    pairs = [(o, c[len(o) :]) for o, c in zip(office, control) if c != o]
    assert len(pairs) > 1500  # every situation line (two of the six forms) got a fix
    import re

    verb_state = re.compile(r" (?:%s) (\w+)" % "|".join(sorted(embedded._VERBS, key=len, reverse=True)))
    fixes_by_state: dict = {}
    for line, fix in pairs:
        state = verb_state.search(line).group(1)
        action = next(a for a in embedded._ACTIONS if fix.endswith(f" {a}."))
        fixes_by_state.setdefault(state, set()).add(action)
    # independent: every situation state meets (nearly) every fix, none is tied to one
    assert min(len(v) for v in fixes_by_state.values()) >= len(embedded._ACTIONS) - 2
    embedded.audit_training_text("\n".join(control), embedded.lab_strings())


def test_control_build_keeps_the_weights_and_changes_only_the_tokenizer(tmp_path, embedded_dir):
    manifest = embedded.build_embedded(tmp_path / "control", text="control")
    office = read_json(embedded_dir / "manifest.json")
    assert manifest["text"] == "control" and office["text"] == "office"
    assert manifest["parameters"] == office["parameters"]
    assert manifest["files"]["model.safetensors"] == office["files"]["model.safetensors"]
    assert manifest["files"]["tokenizer.json"] != office["files"]["tokenizer.json"]
    with pytest.raises(ValueError, match="unknown build text"):
        embedded.build_embedded(tmp_path / "other", text="knowledge")
    assert not (tmp_path / "other").exists()
