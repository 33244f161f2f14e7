"""The embedded default base: a small Qwen2ForCausalLM with its own byte-level BPE tokenizer.

Same class and code path as Qwen2.5-0.5B (grouped-query attention, tied input/output
embeddings, RMSNorm, RoPE), small enough to train LoRA adapters on 2 CPU cores.

`build_embedded(out_dir, seed)` is deterministic: the tokenizer is trained on generated
generic office text (`tokenizer_training_text`) that contains none of the lab's prompts,
responses or probe strings (audited by `audit_training_text`), and the weights are drawn from
`torch.manual_seed(seed)`. Two builds with the same seed are bit-identical; the SHA-256 of the
built files are committed in `rlhf/embedded_expected.json` (EXPECTED_BUILD), and CI checks a
fresh build against them. The model itself is built into each run folder, never shipped.

Why the final RMSNorm weight is a constant 20: a randomly initialised tiny model with std-0.02
tied embeddings produces almost uniform next-token distributions (logits near 0), and LoRA
adapters on the projections alone cannot scale them up enough to concentrate probability.
A frozen final-norm gain of 20 lets the logits reach a useful range; the base stays frozen.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from rlhf.corpus import REVISIONS, build_corpus
from rlhf.io import ArtifactExists, atomic_folder, dumps_json, sha256_file, write_text
from rlhf.rubric import CONTEXTS

EXPECTED_BUILD = Path(__file__).parent / "embedded_expected.json"  # SHA-256 of a build from seed 49
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 1024
FINAL_NORM_GAIN = 20.0
BUILD_SEED = 49

# Shape of the embedded base (profile `embedded` repeats these numbers and the loader checks them).
SHAPE: dict[str, Any] = dict(  # keywords of Qwen2Config
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=VOCAB_SIZE,
)

# Generic office vocabulary for the tokenizer. Generated sentences mix these words freely, so
# the tokenizer learns compact pieces for the lab's domain words without ever seeing the lab's
# sentences (the audit below proves it).
# fmt: off
_SUBJECTS = ["the printer", "my laptop", "the monitor", "a colleague", "the office", "the team",
             "the speaker", "the headset", "the network", "the router", "the cable", "the dock",
             "the document", "the report", "the session", "the account", "the screen", "the queue",
             "the keyboard", "the mouse", "the meeting room", "the help desk", "the manager",
             "the wireless adapter", "the audio", "the file", "the browser", "the login page"]
_VERBS = ["is", "was", "seems", "looks", "stays", "became", "keeps being", "remains"]
_STATES = ["slow", "quiet", "offline", "unplugged", "muted", "frozen", "stuck", "disconnected",
           "expired", "unsaved", "paused", "busy", "blank", "locked", "loose", "silent",
           "connected", "ready", "working", "fine", "restored", "saved", "renewed", "on", "off"]
_TAILS = ["since this morning", "after lunch", "again today", "during the call", "on Monday",
          "for an hour", "before the meeting", "at the reception", "in room 4", "on the third floor",
          "right now", "every few minutes", "after the update", "since yesterday"]
_REQUESTS = ["Please", "Could you", "Can someone", "I would like to", "We need to", "Try to",
             "You might", "Remember to", "It helps to", "Someone should"]
_ACTIONS = ["check the cable", "restart the queue", "turn the volume up", "switch the wireless on",
            "save your work", "sign in again", "renew the password", "restore the connection",
            "plug the charger in", "press the power button", "close the window", "open the settings",
            "clear the print jobs", "test the sound", "reconnect to the network", "log out and back in",
            "update the driver", "reboot the computer", "store a copy", "refresh the page"]
_OPENERS = ["Hello.", "Hi there.", "Good morning.", "Thanks for the note.", "Thank you.",
            "Sorry for the wait.", "Kind regards.", "Best wishes.", "Cheers.", "Have a nice day."]
_HEDGES = ["maybe", "perhaps", "probably", "possibly", "certainly", "definitely", "surely",
           "it might help", "it could work", "it will work", "no guarantee", "not sure"]
_MISC = ["ticket", "incident", "request", "case", "record", "note", "message", "source", "kind",
         "step", "next", "relevant", "guaranteed", "fix", "claim", "without", "remote", "support",
         "context", "previous", "unrelated", "closed", "new", "desk", "help", "give", "one",
         "situation", "card", "preference", "demonstration", "live", "rollout", "number"]
# fmt: on


TEXTS = ("office", "control")


def tokenizer_training_text(seed: int = BUILD_SEED, lines: int = 6000, text: str = "office") -> str:
    """Deterministic generic office text used only to learn the BPE merges.

    "office" (the embedded base): six sentence forms, every field drawn independently; a
    situation (subject + state) and a fix (an action) never share a line.
    "control" (the control base of the base study): the same lines, and after every situation line a
    fix sentence whose action is drawn from a second, independent stream: text that pairs each
    situation with a fix unrelated to it. The first stream is consumed exactly as for "office".
    """
    if text not in TEXTS:
        raise ValueError(f"unknown build text {text!r}; one of {TEXTS}")
    rng = random.Random(seed)
    fixes = random.Random(seed + 1_000_003)  # independent of every situation drawn by `rng`
    out = []
    for _ in range(lines):
        form = rng.randrange(6)
        if form == 0:
            s = f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_STATES)} {rng.choice(_TAILS)}."
        elif form == 1:
            s = f"{rng.choice(_REQUESTS)} {rng.choice(_ACTIONS)}, {rng.choice(_HEDGES)}."
        elif form == 2:
            s = f"{rng.choice(_OPENERS)} {rng.choice(_REQUESTS)} {rng.choice(_ACTIONS)}. {rng.choice(_OPENERS)}"
        elif form == 3:
            s = " ".join(rng.choice(_MISC) for _ in range(rng.randint(3, 9))) + f" {rng.randint(0, 999)}."
        elif form == 4:
            s = (
                f"{rng.choice(_MISC).capitalize()} {rng.randint(0, 300)}, {rng.choice(_MISC)} {rng.randint(0, 20)}: "
                f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_STATES)}."
            )
        else:
            s = f"{rng.choice(_HEDGES).capitalize()} {rng.choice(_ACTIONS)} {rng.choice(_TAILS)}."
        if text == "control" and form in (0, 4):
            s += f" {fixes.choice(_REQUESTS)} {fixes.choice(_ACTIONS)}."
        out.append(s)
    return "\n".join(out) + "\n"


def lab_strings() -> list[str]:
    """Every lab prompt, response and probe string of every corpus revision (r001 and r002):
    what the base must never have seen."""

    strings = set(CONTEXTS)
    for revision in REVISIONS:
        for rec in corpus_records(build_corpus(revision)):
            for key in ("prompt", "chosen", "rejected", "response"):
                if key in rec:
                    strings.add(rec[key])
    return sorted(strings)


def corpus_records(corpus: dict):
    """Yield every model-input record of an in-memory corpus, whatever its grouping."""
    stack = [corpus]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "document_id" in node and "prompt" in node:
                yield node
            else:
                stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)


def audit_training_text(text: str, strings: list[str]) -> None:
    """Raise if any lab string occurs in the text used to build the base or its tokenizer."""
    leaked = [s for s in strings if s and s in text]
    if leaked:
        raise ValueError(f"{len(leaked)} lab strings occur in the embedded build text, e.g. {leaked[0]!r}")


# Qwen2's own pre-tokenization (digits split one by one, NFC): the embedded tokenizer loads
# through transformers' Qwen2Tokenizer exactly as it was trained, like Qwen2.5's does.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def train_tokenizer(text: str):
    """Byte-level BPE with VOCAB_SIZE entries (256 bytes + specials + merges), Qwen2's pipeline."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.splitlines(), trainer=trainer)
    return tok


def build_embedded(
    out_dir: str | os.PathLike, seed: int = BUILD_SEED, audit: bool = True, text: str = "office"
) -> dict:
    """Build the embedded base into `out_dir` (must not exist). Returns the manifest.

    `text="control"` builds the base study's control base: the same shape, weight seed and (zero)
    training budget, with the tokenizer learned on the control text (see tokenizer_training_text).
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a 0.8 MB shard needs no progress bar

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ArtifactExists(f"refusing to overwrite existing model directory {out_dir}")
    t0 = time.perf_counter()
    kind, text = text, tokenizer_training_text(seed, text=text)
    if audit:
        audit_training_text(text, lab_strings())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raw = train_tokenizer(text)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, model_max_length=320
    )
    config = Qwen2Config(
        **SHAPE,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        # transformers 5 takes rope_theta into rope_parameters; its signature does not list it
        rope_theta=10000.0,  # type: ignore[call-arg]
        rms_norm_eps=1e-6,
        hidden_act="silu",
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),  # type: ignore[arg-type]  # one token, one id
        bos_token_id=None,
        use_cache=True,
    )
    # Seeded, single-threaded init so that two builds are bit-identical.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # transformers' wrapped .to: its stub wants the model as argument
        with torch.no_grad():
            model.model.norm.weight.fill_(FINAL_NORM_GAIN)
    finally:
        torch.set_num_threads(threads)

    with atomic_folder(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {
            "kind": "embedded",
            "text": kind,
            "seed": seed,
            "shape": SHAPE,
            "final_norm_gain": FINAL_NORM_GAIN,
            "special_tokens": SPECIAL_TOKENS,
            "eos_token": EOS_TOKEN,
            "pad_token": PAD_TOKEN,
            "eos_token_id": config.eos_token_id,
            "pad_token_id": config.pad_token_id,
            "parameters": sum(p.numel() for p in model.parameters()),
            "tokenizer_text_lines": len(text.splitlines()),
            "files": files,
        }
        write_text(tmp / "manifest.json", dumps_json(manifest))
    manifest["build_seconds"] = round(time.perf_counter() - t0, 2)
    return manifest
