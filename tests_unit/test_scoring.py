"""The one masked scoring path for token log-probs (rlhf.scoring.response_logprobs).

FP32 log-softmax of the logits at the prefix before each response token, gathered at the
response token, masked by position (prompt and padding never count).

Tolerances: NAIVE_ATOL = 1e-5 against a naive full-logits computation (`model(ids).logits`,
log-softmax over every position, gather) on single FP32 sequences: the same ops, except the
vocabulary projection runs on R rows instead of T. PAD_ATOL = 1e-5 for batched vs single and
left vs right padding. BF16_ATOL = 1e-5 for the BF16 base against the naive BF16 logits cast
to FP32 (the same BF16 logits; only the FP32 log-softmax follows). Measured maxima are
recorded in results.json.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlhf.lora import inject_lora
from rlhf.models import load_base
from rlhf.roles import new_role
from rlhf.scoring import (
    logprobs_from_hidden,
    real_token_logits,
    response_logprobs,
    response_targets,
    set_token_count,
    token_count,
)
from rlhf.tokens import collate

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

NAIVE_ATOL = 1e-5
PAD_ATOL = 1e-5
BF16_ATOL = 1e-5


@pytest.fixture(scope="module")
def actor(embedded_profile, embedded_dir, embedded_base, move_adapters):
    role = new_role("actor", embedded_profile, embedded_dir)
    move_adapters(role.model, 21)
    return role.model, embedded_base.eos_id, embedded_base.pad_id


def rows(pad_id, eos_id):
    g = torch.Generator().manual_seed(5)
    r = lambda n: torch.randint(3, 958, (n,), generator=g).tolist()  # noqa: E731
    prompts = [r(7), r(2), r(11), r(4)]
    responses = [r(3) + [eos_id], [pad_id, eos_id], r(6), r(1) + [pad_id] + r(2)]  # PAD ids inside
    return prompts, responses


def naive_logprobs(model, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    # The softmax over the tokenizer's 958 tokens only: the embedding's 66 padding rows cut off
    # here, where rlhf.scoring sets their logits to -inf.
    logp = F.log_softmax(logits[..., :958], dim=-1)[0]
    cols = torch.arange(len(prompt), len(prompt) + len(response))
    return logp[cols - 1, ids[0, cols]]


def test_logprobs_equal_a_naive_full_logits_computation(actor, record_result):
    model, eos_id, pad_id = actor
    prompts, responses = rows(pad_id, eos_id)
    worst = 0.0
    for p, r in zip(prompts, responses):
        batch = collate([p], [r], pad_id)
        with torch.no_grad():
            got = response_logprobs(model, batch)[0]
        want = naive_logprobs(model, p, r)
        assert got.dtype == torch.float32 and got.shape == (len(r),)
        assert torch.all(got <= 0)
        worst = max(worst, float((got - want).abs().max()))
    record_result("max_abs_diff_logprobs_vs_naive", worst)
    record_result("logprobs_vs_naive_atol", NAIVE_ATOL)
    assert worst <= NAIVE_ATOL


def test_left_right_and_single_agree_and_masked_positions_are_exactly_zero(actor, record_result):
    model, eos_id, pad_id = actor
    prompts, responses = rows(pad_id, eos_id)
    alone = []
    for p, r in zip(prompts, responses):
        with torch.no_grad():
            alone.append(response_logprobs(model, collate([p], [r], pad_id))[0])
    out, worst = {}, 0.0
    for side in ("left", "right"):
        batch = collate(prompts, responses, pad_id, padding_side=side)
        with torch.no_grad():
            out[side] = response_logprobs(model, batch)
        assert out[side].dtype == torch.float32
        assert torch.equal(
            response_targets(batch)[batch.response_mask], torch.tensor([t for r in responses for t in r])
        )
        for b, r in enumerate(responses):
            worst = max(worst, float((out[side][b, : len(r)] - alone[b]).abs().max()))
        inactive = out[side][~batch.response_mask]
        assert inactive.numel() == sum(6 - len(r) for r in responses) > 0
        assert torch.all(inactive == 0) and not torch.any(torch.signbit(inactive))  # exactly +0
        assert torch.all(out[side][batch.response_mask] < 0)
    left_right = float((out["left"] - out["right"]).abs().max())
    record_result("max_abs_diff_logprobs_batched_vs_single", worst)
    record_result("max_abs_diff_logprobs_left_vs_right", left_right)
    assert worst <= PAD_ATOL and left_right <= PAD_ATOL


def test_output_is_fp32_for_a_bf16_base(embedded_profile, embedded_dir, embedded_base, move_adapters, record_result):
    base = load_base(embedded_profile, embedded_dir)
    base.model.to(torch.bfloat16)
    inject_lora(base.model, rank=8, alpha=16, seed=49)
    move_adapters(base.model, 21)
    model = base.model
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head.weight is model.model.embed_tokens.weight
    prompts, responses = rows(base.pad_id, base.eos_id)
    batch = collate(prompts, responses, base.pad_id, padding_side="left")
    with torch.no_grad():
        got = response_logprobs(model, batch)
    assert got.dtype == torch.float32
    worst = 0.0
    for b, (p, r) in enumerate(zip(prompts, responses)):
        alone = collate([p], [r], base.pad_id)
        with torch.no_grad():
            single = response_logprobs(model, alone)[0]
        want = naive_logprobs(model, p, r)  # BF16 logits, FP32 log-softmax
        worst = max(worst, float((single - want).abs().max()))
        assert torch.all(got[b, len(r) :] == 0)
    # FP32 log-softmax keeps resolution that a BF16 log-softmax would round away
    with torch.no_grad():
        h = model.model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(), position_ids=batch.position_ids
        ).last_hidden_state
        logits_bf16 = model.lm_head(h)
    assert logits_bf16.dtype == torch.bfloat16
    record_result("max_abs_diff_logprobs_bf16_vs_naive", worst)
    assert worst <= BF16_ATOL
    fine = got[batch.response_mask]
    assert not torch.equal(fine, fine.to(torch.bfloat16).float())  # values below BF16 resolution


def test_masked_positions_are_selected_away_not_multiplied(actor):
    """A non-finite read at a masked position must not leak: nan * 0 is nan (rlhf.masks)."""
    from rlhf.scoring import logprobs_from_hidden

    model, eos_id, pad_id = actor
    h = torch.randn(2, 3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    h[1, 2] = float("nan")
    h[0, 1] = float("inf")
    mask = torch.tensor([[True, False, True], [True, True, False]])
    targets = torch.tensor([[4, 5, 6], [7, 8, 9]])
    with torch.no_grad():
        out = logprobs_from_hidden(model, h, targets, mask)
    assert torch.isfinite(out).all()
    assert out[0, 1] == 0 and out[1, 2] == 0 and torch.all(out[mask] < 0)
    # an integer 0/1 mask is read as a mask; anything else is refused
    with torch.no_grad():
        assert torch.equal(logprobs_from_hidden(model, h, targets, mask.long()), out)
    with pytest.raises(ValueError, match="only 0 and 1"):
        logprobs_from_hidden(model, h, targets, mask.float() * 0.5)


# ------------------------------------------------------------------------------ only real tokens


@pytest.fixture
def tempted(embedded_profile, embedded_dir, move_adapters):
    """An actor whose 66 padding rows (ids 958..1023, no token maps to them) get logits 1e4
    above every real token's, through a hook on the vocabulary projection: unmasked, every
    draw and every argmax would be one of them."""
    role = new_role("actor", embedded_profile, embedded_dir)
    move_adapters(role.model, 22)
    n = token_count(role.model)
    rows = role.model.get_output_embeddings().weight.shape[0]
    bump = torch.zeros(rows)
    bump[n:] = 1e4

    def hook(_module, _inputs, output):
        return output + bump.to(output.dtype)

    role.model.lm_head.register_forward_hook(hook)
    return role.model, n, rows


def test_the_embedded_vocabulary_has_padding_rows_past_the_tokenizer(embedded_base):
    model, tokenizer = embedded_base.model, embedded_base.tokenizer
    assert token_count(model) == len(tokenizer) == 958
    assert model.get_output_embeddings().weight.shape[0] == 1024
    assert tokenizer.decode([957]) != "" and tokenizer.convert_ids_to_tokens(1000) is None  # no token there


@pytest.mark.parametrize("use_cache", [True, False])
def test_nothing_samples_or_picks_an_id_past_the_tokenizer(tempted, embedded_base, use_cache):
    from rlhf.generate import generate

    model, n, rows = tempted
    eos_id, pad_id = embedded_base.eos_id, embedded_base.pad_id
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, n, (k,), generator=g).tolist() for k in (5, 9, 2, 7)]
    with torch.no_grad():  # the hook works: unmasked, the padding rows win everywhere
        hidden = model.model(input_ids=torch.tensor([prompts[0]])).last_hidden_state
        assert bool((model.lm_head(hidden).argmax(-1) >= n).all())
    drawn = []
    for greedy, seed in ((False, 0), (False, 1), (True, None)):
        gen = generate(
            model,
            prompts,
            eos_id=eos_id,
            pad_id=pad_id,
            max_new_tokens=12,
            greedy=greedy,
            generator=None if greedy else torch.Generator().manual_seed(seed),
            use_cache=use_cache,
        )
        drawn += [t for row in gen.responses for t in row]
        assert all(lp > -50 for row in gen.logps for lp in row)  # each a real token's finite log-prob
    assert drawn and max(drawn) < n, sorted(set(t for t in drawn if t >= n))


def test_no_path_of_the_lab_draws_an_out_of_vocabulary_answer(tempted, embedded_base, embedded_profile):
    """The lab's own drawing paths on the tempted actor: PPO's rollouts (sample_like_ppo) on the
    miniature's cut rollouts (8 new tokens) and at the full 64, with and without a KV cache; the
    evaluation's greedy answers and its temperature-1 draws from shared prefills (policy_draws,
    prefills). Every drawn id stays below len(tokenizer), so no answer's finish reason is
    out_of_vocabulary; handed an id of a padding row, decode_response still names it."""
    from types import SimpleNamespace

    from rlhf.evaluate import policy_draws, prefills
    from rlhf.generate import sample_like_ppo
    from rlhf.miniature import miniature_profile
    from rlhf.tokens import Tokens, decode_response

    model, n, rows = tempted
    tokenizer, eos_id, pad_id = embedded_base.tokenizer, embedded_base.eos_id, embedded_base.pad_id
    assert len(tokenizer) == n < rows
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, n, (k,), generator=g).tolist() for k in (6, 3, 8, 4)]
    mini = miniature_profile(embedded_profile)
    answers: dict[str, list[list[int]]] = {}
    for profile, use_cache in ((mini, True), (mini, False), (embedded_profile, True)):
        tokens = Tokens(tokenizer, eos_id, pad_id, use_cache)
        gen = sample_like_ppo(model, prompts, tokens, profile, torch.Generator().manual_seed(7))
        answers[f"rollout {profile.name} cache={use_cache}"] = gen.responses
    assert {len(r) for r in answers[f"rollout {mini.name} cache=True"]} == {8}  # cut: nothing ends early
    ctx = SimpleNamespace(profile=mini, eos_id=eos_id, pad_id=pad_id)
    answers["evaluation greedy"] = policy_draws(model, prompts, ctx)[0]
    starts = prefills(model, prompts, ctx)
    answers["evaluation greedy from a prefill"] = policy_draws(model, prompts, ctx, starts=starts)[0]
    answers["evaluation sampled from a prefill"] = policy_draws(
        model, prompts, ctx, torch.Generator().manual_seed(9), starts
    )[0]
    for path, drawn in answers.items():
        assert len(drawn) == len(prompts) and all(drawn), path
        assert max(t for ids in drawn for t in ids) < n, path
        reasons = {decode_response(tokenizer, ids, eos_id)[1] for ids in drawn}
        assert "out_of_vocabulary" not in reasons, (path, reasons)
    some = answers["evaluation greedy"][0]
    for padding_row in (n, rows - 1):
        assert decode_response(tokenizer, some[:1] + [padding_row] + some[1:], eos_id)[1] == "out_of_vocabulary"


def test_logprobs_sum_to_one_over_the_real_tokens_and_padding_ids_score_minus_inf(tempted):
    model, n, rows = tempted
    with torch.no_grad():
        hidden = model.model(input_ids=torch.tensor([[5, 17, 300, 41]])).last_hidden_state  # [1, 4, H]
        prefix = hidden[:, -1:, :].expand(1, rows, -1)  # one prefix, every id of the vocabulary as target
        logp = logprobs_from_hidden(model, prefix, torch.arange(rows)[None], torch.ones(1, rows, dtype=torch.bool))[0]
    assert float(logp[:n].exp().sum()) == pytest.approx(1.0, abs=1e-5)
    assert bool(torch.isneginf(logp[n:]).all())
    assert bool(torch.isfinite(logp[:n]).all())


def test_real_token_logits_sets_exactly_the_padding_ids_to_minus_inf():
    logits = torch.randn(2, 3, 10)
    out = real_token_logits(logits, 7)
    assert torch.equal(out[..., :7], logits[..., :7]) and bool(torch.isneginf(out[..., 7:]).all())
    assert real_token_logits(logits, 10) is logits  # nothing to cut


def test_a_model_that_does_not_say_its_token_count_is_refused(embedded_base):
    from transformers import Qwen2ForCausalLM

    bare = Qwen2ForCausalLM(embedded_base.model.config)
    with pytest.raises(ValueError, match="how many of its vocabulary rows are real tokens"):
        token_count(bare)
    with pytest.raises(ValueError, match="958 tokens, the model 1024 vocabulary rows|2000 tokens"):
        set_token_count(bare, 2000)
    set_token_count(bare, 958)
    assert token_count(bare) == 958


def test_the_real_token_count_is_part_of_every_identity(tmp_path):
    from rlhf import lab
    from rlhf.io import read_json

    ctx = lab.open_context(tmp_path / "run")
    assert read_json(tmp_path / "run" / "run.json")["identity"]["real_tokens"] == 958
    assert ctx.identity(stage="sft")["real_tokens"] == 958


def test_only_the_scoring_path_and_generation_turn_logits_into_probabilities():
    """One helper: every softmax, log-softmax, sampling draw and argmax over a model's logits is
    in rlhf/scoring.py or rlhf/generate.py, which apply real_token_logits first (the arithmetic
    fingerprint measures raw operations and is not a model path)."""
    import re
    from pathlib import Path

    import rlhf

    root = Path(rlhf.__file__).parent
    pattern = re.compile(r"log_softmax|\bsoftmax\(|multinomial\(|\.logits\b|lm_head\(")
    found = {
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if pattern.search(p.read_text()) and p.name != "arithmetic.py"
    }
    assert found == {"scoring.py", "generate.py"}, found
