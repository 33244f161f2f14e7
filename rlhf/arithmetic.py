"""The CPU arithmetic fingerprint: does this machine compute like the machines the golden numbers
were verified on?

    rlhf arithmetic                       this machine's class, compared with every verified one
    rlhf arithmetic --out FILE.json       ... and its fingerprint written to a file
    rlhf arithmetic --compare FILE.json   ... and compared with another machine's file

The fingerprint is the SHA-256 (16 hex) of the outputs of the CPU operations the embedded lab
runs, in the order the lab meets them, under the process's pinned arithmetic (rlhf.runtime), one
thread:

    ops     primitive operations at the embedded shapes, forward and backward: matmuls, the
            elementwise functions and reductions, cross entropy, RMSNorm, RoPE, attention,
            the embedding's backward, gradient clipping and the lab's AdamW (rlhf.optim.adamw),
            and sampling
    model   one Qwen2ForCausalLM of the embedded shape (rlhf.embedded.SHAPE): every module's
            output, every parameter's gradient, the parameters after each of three updates
    bf16    a BF16 matmul, the qwen profile's base dtype (compared and printed, not part of the
            class: golden numbers exist for the embedded FP32 profile only)

Every input comes from a seeded torch.Generator, the same bytes on every machine. Two machines
whose entries all agree are one arithmetic *class*, named by the SHA-256 of all entries; the
golden numbers (tests_reproducibility/golden_embedded.json) hold on the classes whose
fingerprints are committed in rlhf/fingerprints/. The first entry that differs is where two
CPUs part.

`probes` are measured and printed but never part of the class: operations the lab avoids
because their bytes depend on the CPU vendor under any pin (MKL's vector square root, the
default AdamW built on it). They show why the lab avoids them.
"""

from __future__ import annotations

import hashlib
import platform
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rlhf import runtime
from rlhf.io import read_json_of_kind

VERIFIED_DIR = Path(__file__).with_name("fingerprints")
SEED = 20261201
SECTIONS = ("ops", "model")


def tensor_hash(t) -> str:
    """SHA-256 (16 hex) of a tensor's bytes, or of a list of tensors' hashes."""
    if isinstance(t, (tuple, list)):
        return hashlib.sha256("".join(tensor_hash(x) for x in t).encode()).hexdigest()[:16]
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _Inputs:
    """Seeded inputs, each from its own generator: seed k is SEED + k, in drawing order."""

    def __init__(self):
        self.k = 0

    def seed(self) -> int:
        self.k += 1
        return SEED + self.k

    def randn(self, *shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=_gen(self.seed())) * scale).to(dtype)


def _shape() -> dict[str, Any]:
    from rlhf.embedded import SHAPE

    return SHAPE


Entries = list[tuple[str, str]]  # (name, hash), in execution order


def _linear_ops(r: _Inputs, s: dict) -> Entries:
    """Matmuls (tokens x features), forward and both gradients; a batched and a vector product."""
    hidden, inter, vocab = s["hidden_size"], s["intermediate_size"], s["vocab_size"]
    head = hidden // s["num_attention_heads"]
    kv = head * s["num_key_value_heads"]
    out: Entries = []
    linears = {
        "q_proj": (320, hidden, hidden),
        "kv_proj": (320, hidden, kv),
        "up": (320, hidden, inter),
        "down": (320, inter, hidden),
        "lm_head": (320, hidden, vocab),
        "lora_A": (320, hidden, 8),
        "lora_B": (320, 8, hidden),
        "batch8": (8 * 64, hidden, inter),
    }
    for name, (m, n, p) in linears.items():
        x = r.randn(m, n).requires_grad_()
        w = r.randn(p, n, scale=0.05).requires_grad_()
        y = F.linear(x, w)
        y.backward(r.randn(m, p))
        out += [(f"linear.{name}.fwd", tensor_hash(y)), (f"linear.{name}.grad_x", tensor_hash(x.grad))]
        out.append((f"linear.{name}.grad_w", tensor_hash(w.grad)))
    out.append(("bmm.attn_scores", tensor_hash(torch.bmm(r.randn(4, 320, head), r.randn(4, head, 320)))))
    out.append(("matmul.vector", tensor_hash(r.randn(hidden) @ r.randn(hidden, hidden))))
    return out


def _elementwise_ops(r: _Inputs, s: dict) -> Entries:
    """Elementwise functions and reductions over logits-sized tensors, and small reductions."""
    x = r.randn(8, 320, s["vocab_size"], scale=4.0)
    # fmt: off
    functions = {
        "exp": torch.exp, "log": lambda t: torch.log(t.abs() + 1e-3), "tanh": torch.tanh,
        "sigmoid": torch.sigmoid, "silu": F.silu, "rsqrt": lambda t: torch.rsqrt(t.abs() + 1e-6),
        "pow2": lambda t: t.pow(2), "softmax": lambda t: torch.softmax(t, -1),
        "log_softmax": lambda t: torch.log_softmax(t, -1), "logsumexp": lambda t: torch.logsumexp(t, -1),
        "sum_last": lambda t: t.sum(-1), "mean_last": lambda t: t.mean(-1), "sum_all": torch.sum,
        "cumsum": lambda t: t.cumsum(-1), "max": lambda t: t.max(-1).values,
        "norm": torch.linalg.vector_norm, "logsigmoid": F.logsigmoid, "clamp": lambda t: t.clamp(-3, 3),
        "gather_log_softmax": lambda t: torch.log_softmax(t, -1).gather(-1, t.argmax(-1, keepdim=True)),
    }
    # fmt: on
    out: Entries = [(f"elementwise.{name}", tensor_hash(fn(x))) for name, fn in functions.items()]
    small = r.randn(8, 64)
    out.append(("reduce.small_sum", tensor_hash(small.sum(-1))))
    out.append(("reduce.small_var", tensor_hash(small.pow(2).mean(-1, keepdim=True))))
    out.append(("reduce.var_mean", tensor_hash(torch.var_mean(small, unbiased=False))))
    return out


def _loss_and_norm_ops(r: _Inputs, s: dict) -> Entries:
    """Cross entropy over the vocabulary and RMSNorm (forward and backward), the RoPE tables."""
    hidden, vocab = s["hidden_size"], s["vocab_size"]
    head = hidden // s["num_attention_heads"]
    logits = r.randn(8 * 64, vocab, scale=3.0).requires_grad_()
    target = torch.randint(0, vocab, (8 * 64,), generator=_gen(r.seed()))
    loss = F.cross_entropy(logits, target, reduction="sum")
    loss.backward()
    out: Entries = [("cross_entropy.fwd", tensor_hash(loss)), ("cross_entropy.grad", tensor_hash(logits.grad))]

    # RMSNorm as Qwen2 computes it
    x = r.randn(8, 64, hidden).requires_grad_()
    w = torch.ones(hidden, requires_grad=True)
    y = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    y.backward(r.randn(8, 64, hidden))
    out += [("rmsnorm.fwd", tensor_hash(y)), ("rmsnorm.grad_x", tensor_hash(x.grad))]

    inv_freq = 1.0 / (1000000.0 ** (torch.arange(0, head, 2, dtype=torch.int64).float() / head))
    emb = torch.cat((torch.outer(torch.arange(320).float(), inv_freq),) * 2, -1)
    out += [("rope.cos", tensor_hash(emb.cos())), ("rope.sin", tensor_hash(emb.sin()))]
    return out


def _attention_ops(r: _Inputs, s: dict) -> Entries:
    """Scaled dot-product attention: causal (forward and backward) and with a padding mask."""
    heads = s["num_attention_heads"]
    head = s["hidden_size"] // heads
    out: Entries = []
    for tag, T in (("t64", 64), ("t320", 320)):
        q, k, v = (r.randn(8, heads, T, head).requires_grad_() for _ in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(r.randn(8, heads, T, head))
        out.append((f"sdpa.causal.{tag}.fwd", tensor_hash(y)))
        out.append((f"sdpa.causal.{tag}.grad", tensor_hash((q.grad, k.grad, v.grad))))
        mask = torch.ones(8, 1, T, T, dtype=torch.bool).tril()
        mask[:, :, :, :3] = False
        mask[:, :, torch.arange(T), torch.arange(T)] = True
        y2 = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), attn_mask=mask)
        out.append((f"sdpa.masked.{tag}.fwd", tensor_hash(y2)))
    return out


def _update_and_sampling_ops(r: _Inputs, s: dict) -> Entries:
    """The embedding's backward (index_add with repeated ids), gradient clipping, the lab's
    optimizer, and sampling."""
    from rlhf.optim import adamw

    hidden, vocab = s["hidden_size"], s["vocab_size"]
    table = r.randn(vocab, hidden, scale=0.02).requires_grad_()
    ids = torch.randint(0, vocab, (8, 64), generator=_gen(r.seed()))
    F.embedding(ids, table).backward(r.randn(8, 64, hidden))
    out: Entries = [("embedding.grad", tensor_hash(table.grad))]

    params = [r.randn(64, 64).requires_grad_(), r.randn(256, 64).requires_grad_()]
    opt = adamw(params, lr=3e-3, weight_decay=0.01)
    for step in range(3):
        for p in params:
            p.grad = r.randn(*p.shape)
        out.append((f"clip_grad_norm.step{step}", tensor_hash(torch.nn.utils.clip_grad_norm_(params, 1.0))))
        opt.step()
        out.append((f"adamw.step{step}", tensor_hash(params)))

    probs = torch.softmax(r.randn(4, vocab, scale=3.0), -1)
    out.append(("multinomial", tensor_hash(torch.multinomial(probs, 1, generator=_gen(r.seed())))))
    out.append(("randperm", tensor_hash(torch.randperm(168, generator=_gen(r.seed())))))
    return out


def primitive_ops() -> Entries:
    """The ops section: (name, hash) in execution order. One _Inputs draws every input, so the
    groups run in this order (seed k is the k-th draw)."""
    s, r = _shape(), _Inputs()
    out: Entries = []
    for group in (_linear_ops, _elementwise_ops, _loss_and_norm_ops, _attention_ops, _update_and_sampling_ops):
        out += group(r, s)
    return out


def bf16_ops() -> list[tuple[str, str]]:
    """The bf16 section: the qwen profile's base dtype (oneDNN on the CPU). Compared and printed,
    not part of the class: golden numbers exist for the embedded FP32 profile only."""
    r = _Inputs()
    xb, wb = r.randn(32, 896, dtype=torch.bfloat16), r.randn(896, 896, scale=0.05, dtype=torch.bfloat16)
    return [
        ("bf16.linear", tensor_hash(F.linear(xb, wb))),
        ("bf16.to_float_add", tensor_hash(F.linear(xb, wb).float() + 1.0)),
    ]


def model_step() -> list[tuple[str, str]]:
    """The model section: a Qwen2ForCausalLM of the embedded shape, three updates."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlhf.optim import adamw

    out: list[tuple[str, str]] = []
    config = Qwen2Config(
        **_shape(),
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        # transformers 5 takes rope_theta into rope_parameters; its signature does not list it
        rope_theta=1000000.0,  # type: ignore[call-arg]
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(49)  # inside measure()'s forked RNG: the caller's generator is untouched
    model = Qwen2ForCausalLM(config).float()
    out.append(("init.params", tensor_hash([p for _, p in sorted(model.named_parameters())])))
    seen: list[tuple[str, str]] = []

    def hook(name):
        def record(_module, _inputs, output):
            t = output[0] if isinstance(output, tuple) else getattr(output, "logits", output)
            if torch.is_tensor(t):
                seen.append((name, tensor_hash(t)))

        return record

    handles = [m.register_forward_hook(hook(n or "model")) for n, m in model.named_modules()]
    vocab = config.vocab_size
    ids = torch.randint(3, vocab, (8, 48), generator=_gen(SEED))
    attention_mask = torch.ones_like(ids)
    attention_mask[:3, :5] = 0  # left padding on three rows
    labels = ids.masked_fill(attention_mask == 0, -100)
    opt = adamw(model.parameters(), lr=3e-3, weight_decay=0.01)
    try:
        for step in range(3):
            seen.clear()
            opt.zero_grad(set_to_none=True)
            res = model(input_ids=ids, attention_mask=attention_mask, labels=labels, use_cache=False)
            res.loss.backward()
            if step == 0:
                out += [(f"step0.forward.{name}", value) for name, value in seen]
                out += [(f"step0.grad.{name}", tensor_hash(p.grad)) for name, p in model.named_parameters()]
            out.append((f"step{step}.loss", tensor_hash(res.loss)))
            out.append((f"step{step}.clip", tensor_hash(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))))
            opt.step()
            out.append((f"step{step}.params", tensor_hash([p for _, p in sorted(model.named_parameters())])))
    finally:
        for handle in handles:
            handle.remove()
    return out


def probes() -> dict:
    """Operations the lab avoids, measured for the record (never part of the class)."""
    x = torch.rand(1 << 16, generator=_gen(SEED)) * 10
    root = torch.sqrt(x)  # MKL's vector math on the CPU
    exact = x.double().sqrt().float()  # IEEE square root, then one rounding: correctly rounded
    params = [torch.randn(64, 64, generator=_gen(SEED + 1)).requires_grad_()]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01, foreach=False)
    for step in range(3):
        params[0].grad = torch.randn(64, 64, generator=_gen(SEED + 2 + step))
        opt.step()
    return {
        "sqrt.vector_math": tensor_hash(root),
        "sqrt.vector_math_not_correctly_rounded": f"{int((root != exact).sum())} of {x.numel()}",
        "sqrt.ieee": tensor_hash(exact),
        "adamw.single_tensor": tensor_hash(params),
    }


def environment() -> dict:
    """Where the fingerprint was measured (never compared)."""
    info: dict[str, object] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        lines = cpuinfo.read_text().splitlines()

        def field(key):
            return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), "?")

        info["cpu"] = field("model name")
        info["vendor"] = field("vendor_id")
        info["family_model"] = f"{field('cpu family')}/{field('model')}"
        flags = field("flags").split()
        info["flags"] = sorted(f for f in flags if f.startswith(("avx", "fma", "sse4", "amx", "f16c")))
    else:
        info["cpu"] = platform.processor() or platform.machine()
    # The vendor as MKL's own CPUID check sees it (an emulated CPU shows here, not in /proc/cpuinfo).
    info["mkl_sees_intel"] = runtime.mkl_sees_intel()
    info["arithmetic"] = runtime.describe()
    return info


@contextmanager
def _isolated():
    """One thread and a forked RNG: measuring leaves the caller's process as it was."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


def class_of(fp: dict) -> str:
    """The arithmetic class: SHA-256 (16 hex) over every compared entry, in order."""
    text = "\n".join(f"{section}.{name}={value}" for section in SECTIONS for name, value in fp[section])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measure() -> dict:
    """This machine's fingerprint: env, ops, model, probes and the class (about 3 s)."""
    with _isolated():
        fp = {"env": environment(), "ops": primitive_ops(), "model": model_step(), "bf16": bf16_ops()}
        fp["probes"] = probes()
    fp["class"] = class_of(fp)
    return fp


def differences(mine: dict, other: dict, sections=SECTIONS) -> list[str]:
    """Every compared entry whose hash differs, in this machine's execution order; entries one
    side lacks are not compared."""
    out = []
    for section in sections:
        theirs = dict(map(tuple, other.get(section, [])))
        for name, value in mine[section]:
            if name in theirs and theirs[name] != value:
                out.append(f"{section}.{name}")
    return out


def unshared(mine: dict, other: dict) -> str:
    """The entries one fingerprint holds and the other lacks (an older fingerprint, another
    version of the lab), named for a user: every shared entry may be equal while the classes differ."""
    names = []
    for section in SECTIONS:
        here, there = [n for n, _ in mine[section]], {n for n, _ in map(tuple, other.get(section, []))}
        names += [f"{section}.{n} only here" for n in here if n not in there]
        names += [f"{section}.{n} only there" for n in sorted(there - set(here))]
    return ", ".join(names) if names else "the same entries in another order"


def compared(mine: dict, other: dict) -> int:
    """How many entries both fingerprints hold."""
    return sum(len({n for n, _ in mine[s]} & {n for n, _ in map(tuple, other.get(s, []))}) for s in SECTIONS)


def load(path) -> dict:
    """A fingerprint file (this module's format, or the older {section: {name: hash}} form);
    anything else is refused with a ValueError naming the file and what is wrong with it."""
    sections = {s: (list, dict) for s in SECTIONS}
    fp = read_json_of_kind(path, "fingerprint file", sections, "sections", "`rlhf arithmetic --out FILE` writes one")
    for section in (*SECTIONS, "bf16"):
        if isinstance(fp.get(section), dict):
            fp[section] = list(fp[section].items())
    fp.setdefault("class", class_of(fp))
    return fp


def verified() -> dict[str, dict]:
    """The committed fingerprints of the CPU classes the golden numbers were verified on."""
    return {path.stem: load(path) for path in sorted(VERIFIED_DIR.glob("*.json"))}


def verdict(fp: dict, known: dict[str, dict] | None = None) -> dict:
    """Which verified class this fingerprint belongs to, and where it parts from each other one.

    {"class": id, "verified": name or None, "first_difference": {name: entry or None}, "line": one
    sentence for a user}."""
    known = verified() if known is None else known
    matches = [name for name, other in known.items() if other["class"] == fp["class"]]
    first = {}
    for name, other in known.items():
        diff = differences(fp, other)
        first[name] = diff[0] if diff else None
    if not fp["env"]["arithmetic"]["comparable"]:
        line = f"the golden numbers do not apply here: {fp['env']['arithmetic']['note']}"
    elif matches:
        line = f"the golden numbers apply on this machine: arithmetic class {fp['class']} ({', '.join(matches)})"
    elif known:
        parts = "; ".join(
            f"{name} from {entry}" if entry else f"{name} in which entries it holds ({unshared(fp, known[name])})"
            for name, entry in first.items()
        )
        line = (
            f"the golden numbers were not verified on this machine's arithmetic class {fp['class']}: "
            f"it parts from {parts} (rlhf arithmetic shows every difference)"
        )
    else:
        line = f"no verified arithmetic class is committed; this machine is class {fp['class']}"
    return {"class": fp["class"], "verified": matches[0] if matches else None, "first_difference": first, "line": line}


def golden_line(profile) -> str:
    """The one line `rlhf lab` prints at start: do the golden numbers apply to this run?"""
    if profile.name != "embedded" or profile.model.dtype != "float32":
        return (
            f"golden numbers: none for profile {profile.name} (they exist for the embedded FP32 profile only); "
            f"arithmetic: {runtime.describe()['note']}"
        )
    return "golden numbers: " + verdict(measure())["line"]


def report(fp: dict, other: dict | None = None, other_name: str = "") -> str:
    """The text `rlhf arithmetic` prints."""
    env, arith = fp["env"], fp["env"]["arithmetic"]
    lines = [
        f"this machine: {env.get('cpu')} ({env.get('vendor', '?')}, family/model {env.get('family_model', '?')})",
        f"arithmetic: {arith['note']}",
        f"  torch {arith['torch']} {arith['cpu_capability']} kernels, MKL branch {arith['mkl_branch']}, "
        f"oneDNN max ISA {arith['environment'].get('ONEDNN_MAX_CPU_ISA')}",
        f"fingerprint: {len(fp['ops'])} operations and {len(fp['model'])} model entries; class {fp['class']}",
    ]
    known = verified()
    for name, ref in known.items():
        diff = differences(fp, ref)
        cpu = ref["env"].get("cpu", "?")
        state = "same class" if not diff else f"{len(diff)} of {compared(fp, ref)} differ, first {diff[0]}"
        lines.append(f"  verified class {ref['class']} ({name}: {cpu}): {state}")
        bf16 = differences(fp, ref, ("bf16",))
        lines.append(f"    BF16 (no golden numbers): {'same' if not bf16 else 'differs at ' + bf16[0]}")
    if other is not None:
        diff = differences(fp, other, (*SECTIONS, "bf16"))
        lines.append(f"compared with {other_name} ({other.get('env', {}).get('cpu', '?')}):")
        lines += [f"  DIFFERS {entry}" for entry in diff]
        lines.append(f"  {len(diff)} of {compared(fp, other)} entries differ")
    probe = fp["probes"]
    lines.append(
        f"not used by the lab: torch.sqrt through MKL's vector math, {probe['sqrt.vector_math_not_correctly_rounded']}"
        " values not correctly rounded (its bytes depend on the CPU vendor)"
    )
    lines.append(verdict(fp, known)["line"])
    return "\n".join(lines)
