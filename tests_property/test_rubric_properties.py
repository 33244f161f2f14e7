"""Properties of the rubric (SPEC §3).

The grammar is finite: 6 actions x 3 cautions x 2 politeness = 36 responses, and with the 6
expected actions and 2 endings (eos, length) a checker call has 432 cases (216 more for each of
the 3 token faults). Those are looped over exhaustively, not sampled. Hypothesis draws only
what is infinite: arbitrary text, junk around a response, whitespace runs.
"""

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from property_budget import examples

from rlhf import rubric
from rlhf.rubric import evaluate, normalize, render

pytestmark = pytest.mark.unit

ACTIONS = range(len(rubric.ACTIONS))
DESIGNS = list(itertools.product(ACTIONS, (0, 1, 2), (False, True)))  # 36
CASES = list(itertools.product(DESIGNS, ACTIONS, ("eos", "length")))  # 432
whitespace = st.text(alphabet=" \t\n\r\u00a0\u2003\x0b\x0c", min_size=1, max_size=4)


def _in_language(text: str) -> bool:
    n = normalize(text)
    return n in rubric.RESPONSES or n in rubric.REFUSALS


def test_the_grammar_has_36_responses_and_432_checker_cases():
    assert len(DESIGNS) == 36 and len(CASES) == 432
    assert len({render(*d) for d in DESIGNS}) == 36  # every design renders differently


def test_every_rendering_is_recognised_with_its_design_all_432_cases():
    """Each of the 432 (design, expected action, finish) cases, with the SPEC's success rule
    written out: the relevant action, no certainty clause, ended by EOS."""
    successes = 0
    for (a, c, p), expected, finish in CASES:
        r = evaluate(render(a, c, p), finish, expected)
        assert tuple(r) == rubric.RESULT_KEYS
        assert r["recognized"] is True and r["status"] == "CERTIFIED" and r["refusal"] is False
        assert (r["action"], r["unsupported_certainty"], r["polite"]) == (a, c == 2, p)
        assert r["relevant"] is (a == expected)
        want = a == expected and c != 2 and finish == "eos"
        assert r["rubric_success"] is want, ((a, c, p), expected, finish, r)
        if finish == "length":
            assert "no EOS" in r["reason"]
        successes += want
    # 6 relevant (a == expected) x 2 cautions without certainty x 2 politeness, EOS only
    assert successes == 24


def test_a_token_fault_is_never_a_success_all_648_cases():
    for (a, c, p), expected, fault in itertools.product(DESIGNS, ACTIONS, rubric.TOKEN_FAULTS):
        r = evaluate(render(a, c, p), fault, expected)
        assert r["status"] == "UNCERTIFIED" and r["recognized"] is False
        assert r["rubric_success"] is False and r["reason"].startswith(fault)
        assert r["unsupported_certainty"] is None and r["action"] is None


def test_case_changes_are_not_recognised_all_36_designs():
    for a, c, p in DESIGNS:
        for variant in (render(a, c, p).swapcase(), render(a, c, p).lower(), render(a, c, p).upper()):
            assert not _in_language(variant)
            assert evaluate(variant, "eos", a)["status"] == "UNCERTIFIED"


def test_declared_refusals_are_recognised_and_never_succeed_all_cases():
    for text, expected, finish in itertools.product(rubric.REFUSALS, ACTIONS, ("eos", "length")):
        for ws in ("", " ", "\n\t ", "\u00a0"):
            r = evaluate(ws + text + ws, finish, expected)
            assert r["recognized"] is True and r["refusal"] is True and r["rubric_success"] is False
            assert r["unsupported_certainty"] is False and r["action"] is None
            assert r["relevant"] is False and r["polite"] is False


@examples(300)
@given(st.text(max_size=200), st.sampled_from(ACTIONS), st.sampled_from(rubric.FINISH_REASONS))
def test_arbitrary_text_is_uncertified_and_never_a_success(text, expected, finish):
    assume(not _in_language(text))
    r = evaluate(text, finish, expected)
    assert r["recognized"] is False and r["status"] == "UNCERTIFIED"
    assert r["unsupported_certainty"] is None and r["rubric_success"] is False
    assert r["action"] is None and r["refusal"] is False


@examples(60)
@given(junk=st.text(min_size=1, max_size=30))
def test_extra_text_around_any_response_is_uncertified(junk):
    assume(junk.strip())
    for (a, c, p), before in itertools.product(DESIGNS, (True, False)):
        text = (junk + " " + render(a, c, p)) if before else (render(a, c, p) + " " + junk)
        if _in_language(text):
            continue  # junk that completes another grammar string (e.g. a polite formula)
        r = evaluate(text, "eos", a)
        assert r["status"] == "UNCERTIFIED" and r["rubric_success"] is False


MAX_WORDS = max(len(render(*d).split(" ")) for d in DESIGNS)


@examples(60)
@given(seps=st.lists(whitespace, min_size=MAX_WORDS + 1, max_size=MAX_WORDS + 1))
def test_whitespace_runs_are_collapsed_in_every_response(seps):
    """One draw of whitespace runs, put between the words of each of the 36 responses."""
    for a, c, p in DESIGNS:
        words = render(a, c, p).split(" ")
        text = seps[0] + "".join(w + s for w, s in zip(words, seps[1:]))
        r = evaluate(text, "eos", a)
        assert r["recognized"] and (r["action"], r["polite"], r["unsupported_certainty"]) == (a, p, c == 2)
        assert r["rubric_success"] is (c != 2)
