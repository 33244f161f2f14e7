"""The rubric's grammar, result fields, finish reasons, refusals and whitespace/case policy."""

import re

import pytest

from rlhf import rubric
from rlhf.rubric import evaluate, render

pytestmark = pytest.mark.unit


def test_literal_renderings():
    assert render(0, 1, False) == "Restart the print queue from the printer settings. This may help."
    assert render(3, 0, False) == "Turn Wi-Fi back on from the network menu."
    assert render(1, 2, True) == (
        "Thank you for reporting this. Check whether the network cable is unplugged and plug it "
        "back in. This will definitely fix it. Have a pleasant day."
    )
    assert rubric.response is render


def test_grammar_is_36_distinct_short_sentences():
    texts = [render(a, c, p) for a in range(6) for c in (0, 1, 2) for p in (False, True)]
    assert len(set(texts)) == 36 == len(rubric.RESPONSES)
    assert max(len(t.split()) for t in texts) <= 30
    assert len(rubric.ACTIONS) == len(rubric.CONTEXTS) == len(rubric.INSTRUCTIONS) == 6
    assert len(set(rubric.CONTEXTS)) == 6


def _ngrams(text, n=4):
    words = re.findall(r"[a-z0-9-]+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_contexts_do_not_contain_the_answer_text():
    phrases = [*rubric.INSTRUCTIONS, *rubric.CAUTION_CLAUSES[1:], rubric.POLITE_OPENING, rubric.POLITE_CLOSING]
    for ctx in rubric.CONTEXTS:
        for phrase in phrases:
            assert phrase not in ctx
            assert not (_ngrams(ctx) & _ngrams(phrase)), (ctx, phrase)


def test_result_has_exactly_the_spec_keys():
    for text in (render(2, 1, True), "I cannot help with that.", "something else"):
        assert tuple(evaluate(text, "eos", 2)) == rubric.RESULT_KEYS
    # The SPEC's keys written out, not read from rubric.RESULT_KEYS: a key dropped or renamed in
    # the code must fail here.
    assert set(rubric.RESULT_KEYS) == {
        "recognized",
        "status",
        "action",
        "relevant",
        "unsupported_certainty",
        "polite",
        "refusal",
        "reason",
        "rubric_success",
    }


def test_success_and_failures_with_eos():
    ok = evaluate(render(4, 1, True), "eos", 4)
    assert ok["recognized"] and ok["status"] == "CERTIFIED" and ok["rubric_success"]
    assert ok["action"] == 4 and ok["relevant"] and ok["polite"] and not ok["refusal"]
    assert ok["unsupported_certainty"] is False
    wrong = evaluate(render(5, 0, False), "eos", 4)
    assert wrong["recognized"] and not wrong["relevant"] and not wrong["rubric_success"]
    assert "irrelevant" in wrong["reason"]
    sure = evaluate(render(4, 2, False), "eos", 4)
    assert sure["relevant"] and sure["unsupported_certainty"] is True
    assert not sure["rubric_success"] and "certainty" in sure["reason"]


def test_truncation_is_never_silently_accepted():
    r = evaluate(render(0, 1, False), "length", 0)
    assert r["recognized"] and r["relevant"] and not r["rubric_success"]
    assert "length" in r["reason"] and "no EOS" in r["reason"]
    other = evaluate("Restart the print", "length", 0)
    assert other["status"] == "UNCERTIFIED" and "length" in other["reason"]


@pytest.mark.parametrize("fault", ["out_of_vocabulary", "control_token", "broken_text"])
def test_a_token_fault_is_uncertified_even_for_grammar_text_and_its_reason_names_it(fault):
    r = evaluate(render(0, 1, False), fault, 0)
    assert r["recognized"] is False and r["status"] == "UNCERTIFIED"
    assert r["unsupported_certainty"] is None and not r["rubric_success"]
    assert r["reason"].startswith(f"{fault}: ") and "UNCERTIFIED" in r["reason"]
    assert r["reason"] == rubric.FAULT_REASONS[fault]
    others = [f for f in rubric.TOKEN_FAULTS if f != fault]
    assert not any(o in r["reason"] for o in others)  # the reason names its own fault only


def test_the_finish_reasons_are_the_two_endings_and_the_three_faults():
    assert rubric.FINISH_REASONS == ("eos", "length", "control_token", "broken_text", "out_of_vocabulary")
    assert set(rubric.TOKEN_FAULTS) == set(rubric.FINISH_REASONS) - {"eos", "length"}


@pytest.mark.parametrize("bad", ["stop", "", None, "EOS", "max_tokens", "undecodable"])
def test_unknown_finish_reason_raises(bad):
    with pytest.raises(ValueError, match="finish_reason"):
        evaluate(render(0, 1, False), bad, 0)


@pytest.mark.parametrize("bad", [-1, 6, 1.0, True, "0", None])
def test_bad_expected_action_raises(bad):
    with pytest.raises(ValueError, match="expected_action"):
        evaluate(render(0, 1, False), "eos", bad)


def test_non_text_raises():
    with pytest.raises(TypeError):
        evaluate(b"Restart the print queue from the printer settings.", "eos", 0)


@pytest.mark.parametrize("args", [(6, 0, False), (0, 3, False), (0, 1, 1), (-1, 0, True), (0, True, False)])
def test_render_rejects_out_of_grammar_designs(args):
    with pytest.raises(ValueError):
        render(*args)


@pytest.mark.parametrize("text", rubric.REFUSALS)
def test_declared_refusals(text):
    r = evaluate(text, "eos", 3)
    assert r["recognized"] and r["status"] == "CERTIFIED" and r["refusal"]
    assert r["action"] is None and not r["relevant"] and not r["rubric_success"]
    assert r["unsupported_certainty"] is False and r["reason"].startswith("declared refusal")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Restart the printer.",
        "Please restart the print queue from the printer settings.",
        # only half of the polite formulas: not in the grammar
        "Thank you for reporting this. Restart the print queue from the printer settings.",
        "Restart the print queue from the printer settings. This may help. Have a pleasant day.",
        # two instructions
        "Restart the print queue from the printer settings. Turn Wi-Fi back on from the network menu.",
        "Restart the print queue from the printer settings",  # missing final period
        "I can't help with that",
    ],
)
def test_other_prose_is_uncertified(text):
    r = evaluate(text, "eos", 0)
    assert r["recognized"] is False and r["status"] == "UNCERTIFIED"
    assert r["unsupported_certainty"] is None and r["rubric_success"] is False
    assert r["action"] is None and not r["refusal"] and "outside the response grammar" in r["reason"]


def test_whitespace_policy_strips_and_collapses():
    base = render(2, 1, True)
    spaced = "\n\t  " + base.replace(" ", " \t\n\u00a0 ") + "  \r\n"
    assert rubric.normalize(spaced) == base
    r = evaluate(spaced, "eos", 2)
    assert r["recognized"] and r["rubric_success"] and r["polite"]
    glued = base.replace(". ", ".")  # removing whitespace between sentences is not allowed
    assert not evaluate(glued, "eos", 2)["recognized"]


def test_case_policy_is_case_sensitive():
    base = render(2, 1, False)
    for variant in (base.lower(), base.upper(), base.replace("Turn", "turn")):
        r = evaluate(variant, "eos", 2)
        assert r["status"] == "UNCERTIFIED" and not r["rubric_success"]
    assert not evaluate(rubric.REFUSALS[0].lower(), "eos", 0)["recognized"]
