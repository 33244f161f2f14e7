"""The embedded base: deterministic build, committed hashes, no lab text, Qwen2 code path."""
import json
import shutil
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
