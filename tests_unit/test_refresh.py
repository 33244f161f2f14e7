"""The reward designs that keep the judge in distribution, piece by piece: the iterated judge's
labeller (rlhf.refresh) on hand-made answers, the pairs a refresh stores from scripted answers,
when a refresh is due, the ensembles' scores (rlhf.ppo_math), and the profile keys that select
and size them."""

from __future__ import annotations

import pytest

from rlhf import designs, refresh, rubric
from rlhf.config import override
from rlhf.generate import Generation
from rlhf.models import check_tokenizer, load_tokenizer
from rlhf.ppo import RolloutData
from rlhf.refresh import label_pair, labeller_verdict, refresh_due
from rlhf.roles import PpoRoles, new_role
from rlhf.tokens import decode_response, encode_response

pytestmark = pytest.mark.unit

# One family whose action is 0; the grammar's renderings of action 0 and of another action.
ACTIONS = {"OH007": 0}
TRAIN = {"document_id": "r-OH007-2", "family": "OH007", "split": "train"}


def rendering(action: int, polite: bool = False) -> str:
    """A rubric success for `action` (no unsupported certainty), with or without the closing."""
    for text, (a, caution, p) in rubric.RESPONSES.items():
        if a == action and caution != 2 and p == polite:
            return text
    raise LookupError(action)


@pytest.fixture(scope="module")
def tok(embedded_dir, embedded_profile):
    tokenizer = load_tokenizer(embedded_dir)
    eos_id, _ = check_tokenizer(embedded_profile, tokenizer)
    return tokenizer, eos_id


@pytest.fixture(scope="module")
def answers(tok, embedded_profile):
    """Token ids of hand-made answers to TRAIN, as the actor would emit them."""
    tokenizer, eos_id = tok
    limits = embedded_profile.limits

    def ids(text):
        return encode_response(tokenizer, text, eos_id, limits)

    right = ids(rendering(0))
    lone_byte = next(i for i in range(len(tokenizer)) if tokenizer.decode([i]) == "\ufffd")  # not UTF-8 alone
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    return {
        "right": right,
        "right_polite": ids(rendering(0, polite=True)),
        "wrong_polite": ids(rendering(3, polite=True)),
        "right_without_eos": right[:-1],  # cut at the limit: no EOS
        "right_out_of_vocabulary": right[:-1] + [len(tokenizer) + 5, eos_id],  # a padding row of the embedding
        "right_control_token": right[:-1] + [im_start, eos_id],
        "right_broken_text": right[:-1] + [lone_byte, eos_id],
        "prose": ids("Please try again later, thank you."),
        "refusal": ids(rubric.REFUSALS[0]),
    }


FAILURES = (
    "wrong_polite",
    "right_without_eos",
    "right_out_of_vocabulary",
    "right_control_token",
    "right_broken_text",
    "prose",
    "refusal",
)


def verdict(name, answers, tok):
    tokenizer, eos_id = tok
    return labeller_verdict(TRAIN, answers[name], tokenizer, eos_id, ACTIONS)


def test_the_labeller_prefers_a_success_to_any_failure(answers, tok):
    for good in ("right", "right_polite"):
        for bad in FAILURES:
            a, b = verdict(good, answers, tok), verdict(bad, answers, tok)
            assert a["rubric_success"] and not b["rubric_success"], (good, bad)
            assert label_pair(a, b) == 0, (good, bad)
            assert label_pair(b, a) == 1, (bad, good)


def test_the_labeller_gives_no_label_when_both_or_neither_succeed(answers, tok):
    assert label_pair(verdict("right", answers, tok), verdict("right_polite", answers, tok)) is None
    for x in FAILURES:
        for y in FAILURES:
            assert label_pair(verdict(x, answers, tok), verdict(y, answers, tok)) is None, (x, y)


def test_what_the_labeller_reads_of_broken_answers(answers, tok):
    """A cut answer is read as cut, an answer with a token fault by the fault's name, prose as
    UNCERTIFIED: the same rubric as the held-out evaluation's. Each verdict carries its finish
    reason, which the refresh record counts."""
    assert "no EOS" in verdict("right_without_eos", answers, tok)["reason"]
    assert verdict("right_without_eos", answers, tok)["finish_reason"] == "length"
    for fault in rubric.TOKEN_FAULTS:
        v = verdict(f"right_{fault}", answers, tok)
        assert v["finish_reason"] == fault and v["reason"].startswith(fault), (fault, v)
    assert verdict("prose", answers, tok)["status"] == rubric.UNCERTIFIED
    reasons = [verdict(name, answers, tok)["finish_reason"] for name in answers]
    assert reasons.count("eos") == 5  # right, right_polite, wrong_polite, prose, refusal


@pytest.mark.parametrize(
    "record",
    [
        {**TRAIN, "split": "validation"},
        {**TRAIN, "split": "test"},
        {**TRAIN, "family": "OH999"},  # a family without train pairs
        {"document_id": "x", "family": "OH007"},  # no split at all
    ],
)
def test_the_labeller_refuses_anything_but_a_train_prompt_of_a_train_family(answers, tok, record):
    tokenizer, eos_id = tok
    with pytest.raises(ValueError, match="train prompts of train families only"):
        labeller_verdict(record, answers["right"], tokenizer, eos_id, ACTIONS)


# Four train prompts of four families (family i has action i // 40, SPEC §2) and the two answers
# the actor gives each, in the order it gives them: a success first, a success second, two
# successes (no label), a success after an answer cut without EOS.
FAMILIES = ("OH005", "OH050", "OH130", "OH210")
ANSWER_PAIRS = {
    "OH005": ("right", "wrong_action"),
    "OH050": ("certain", "right_polite"),
    "OH130": ("right", "right_polite"),
    "OH210": ("right_without_eos", "right"),
}


def answer_ids(kind: str, action: int, tokenizer, eos_id: int, limits) -> list[int]:
    text = {
        "right": rubric.render(action, 1, False),
        "right_polite": rubric.render(action, 0, True),
        "right_without_eos": rubric.render(action, 1, False),
        "certain": rubric.render(action, 2, False),  # unsupported certainty: never a success
        "wrong_action": rubric.render((action + 1) % 6, 1, False),
    }[kind]
    ids = encode_response(tokenizer, text, eos_id, limits)
    return ids[:-1] if kind == "right_without_eos" else ids


def test_every_pair_a_refresh_stores_has_a_success_chosen_over_a_failure(
    tok, embedded_profile, embedded_dir, embedded_base, monkeypatch
):
    """A refresh of a (fresh) judge on scripted answers: it stores exactly the three pairs
    whose answers differ in rubric success, each with the prompt it answers, and in every stored
    pair the chosen answer is a rubric success on the prompt family's action and the rejected one
    is not - whichever of the two the actor gave first."""
    tokenizer, eos_id = tok
    profile = override(
        embedded_profile,
        {("ppo", "reward_design"): "iterated-judge", ("ppo", "refresh_prompts"): 4, ("ppo", "refresh_updates"): 1},
    )
    action_of = {family: int(family[2:]) // 40 for family in FAMILIES}
    prompts = [
        {"document_id": f"{family}-RL0", "family": family, "split": "train", "prompt": f"prompt of {family}"}
        for family in FAMILIES
    ]
    encoded = [[20 + i] * (4 + i) for i in range(len(FAMILIES))]  # distinct, so each answer finds its prompt
    answers = {
        tuple(encoded[i]): [answer_ids(k, action_of[f], tokenizer, eos_id, profile.limits) for k in ANSWER_PAIRS[f]]
        for i, f in enumerate(FAMILIES)
    }

    def scripted(model, asked, tokens, profile, generator):
        """The actor's two answers to each asked prompt, first then second, as if sampled."""
        seen: dict[tuple, int] = {}
        responses = []
        for ids in asked:
            k = seen[tuple(ids)] = seen.get(tuple(ids), -1) + 1
            responses.append(answers[tuple(ids)][k])
        return Generation(responses, [[-1.0] * len(r) for r in responses], [r[-1] == tokens.eos_id for r in responses])

    monkeypatch.setattr(refresh, "sample_like_ppo", scripted)
    judge = new_role("judge", profile, embedded_dir)
    data = refresh.start(profile, "cpu")
    corpus_pair = ("corpus", [10, 11, 12], answers[tuple(encoded[0])][0], answers[tuple(encoded[0])][1])
    roles = PpoRoles(actor=judge, reference=judge, judge=judge, critic=judge)  # the actor's sampling is scripted
    pool = RolloutData(prompts, encoded, None, action_of, [corpus_pair])
    record = refresh.refresh_judge(roles, data, pool, embedded_base.tokens, profile, 2)
    by_id = {r["document_id"]: (r, encoded[i]) for i, r in enumerate(prompts)}
    assert record["new_pairs"] == len(data.pairs) == 3
    assert sorted(p[0] for p in data.pairs) == ["OH005-RL0", "OH050-RL0", "OH210-RL0"]
    for document_id, prompt_ids, chosen, rejected in data.pairs:
        prompt, ids = by_id[document_id]
        action = action_of[prompt["family"]]
        assert list(prompt_ids) == ids, document_id
        assert sorted([list(chosen), list(rejected)]) == sorted(answers[tuple(ids)]), document_id
        assert rubric.evaluate(*decode_response(tokenizer, chosen, eos_id), action)["rubric_success"], document_id
        assert not rubric.evaluate(*decode_response(tokenizer, rejected, eos_id), action)["rubric_success"], document_id


def test_a_refresh_is_due_at_multiples_of_k_and_never_after_the_last_iteration(embedded_profile):
    p = override(embedded_profile, {("ppo", "reward_design"): "iterated-judge", ("ppo", "refresh_every"): 10})
    assert [n for n in range(0, 101) if refresh_due(n, p)] == [10, 20, 30, 40, 50, 60, 70, 80, 90]
    p7 = override(p, {("ppo", "refresh_every"): 7})
    assert [n for n in range(0, 101) if refresh_due(n, p7)] == list(range(7, 100, 7))
    # Only the iterated judge refreshes.
    for design in set(designs.NAMES) - {"iterated-judge"}:
        other = override(embedded_profile, {("ppo", "reward_design"): design})
        assert not any(refresh_due(n, other) for n in range(101)), design
