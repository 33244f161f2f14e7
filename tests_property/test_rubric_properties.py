"""Hypothesis properties of the rubric (SPEC §3)."""
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlhf import rubric
from rlhf.rubric import evaluate, normalize, render

pytestmark = pytest.mark.unit

actions = st.integers(0, 5)
cautions = st.integers(0, 2)
flags = st.booleans()
finishes = st.sampled_from(["eos", "length"])
whitespace = st.text(alphabet=" \t\n\r\u00a0\u2003\x0b\x0c", min_size=1, max_size=4)


def _in_language(text: str) -> bool:
    n = normalize(text)
    return n in rubric.RESPONSES or n in rubric.REFUSALS


@settings(max_examples=300)
@given(actions, cautions, flags, actions, finishes)
def test_every_rendering_is_recognised_with_its_design(a, c, p, expected, finish):
    r = evaluate(render(a, c, p), finish, expected)
    assert r["recognized"] and r["status"] == "CERTIFIED" and not r["refusal"]
    assert (r["action"], r["unsupported_certainty"], r["polite"]) == (a, c == 2, p)
    assert r["relevant"] == (a == expected)
    assert r["rubric_success"] == (a == expected and c != 2 and finish == "eos")
    assert tuple(r) == rubric.RESULT_KEYS


@settings(max_examples=100)
@given(actions, cautions, flags, actions)
def test_undecodable_is_never_a_success(a, c, p, expected):
    r = evaluate(render(a, c, p), "undecodable", expected)
    assert r["status"] == "UNCERTIFIED" and not r["rubric_success"] and "undecodable" in r["reason"]


@settings(max_examples=300)
@given(st.text(max_size=200), actions, st.sampled_from(rubric.FINISH_REASONS))
def test_arbitrary_text_is_uncertified_and_never_a_success(text, expected, finish):
    assume(not _in_language(text))
    r = evaluate(text, finish, expected)
    assert r["recognized"] is False and r["status"] == "UNCERTIFIED"
    assert r["unsupported_certainty"] is None and r["rubric_success"] is False
    assert r["action"] is None and r["refusal"] is False


@settings(max_examples=200)
@given(actions, cautions, flags, st.text(min_size=1, max_size=30), st.booleans())
def test_extra_text_around_a_response_is_uncertified(a, c, p, junk, before):
    assume(junk.strip())
    text = (junk + " " + render(a, c, p)) if before else (render(a, c, p) + " " + junk)
    assume(not _in_language(text))
    r = evaluate(text, "eos", a)
    assert r["status"] == "UNCERTIFIED" and not r["rubric_success"]


@settings(max_examples=200)
@given(actions, cautions, flags, st.data())
def test_whitespace_runs_are_collapsed(a, c, p, data):
    words = render(a, c, p).split(" ")
    seps = [data.draw(whitespace) for _ in range(len(words) + 1)]
    text = seps[0] + "".join(w + s for w, s in zip(words, seps[1:]))
    r = evaluate(text, "eos", a)
    assert r["recognized"] and (r["action"], r["polite"]) == (a, p)
    assert r["rubric_success"] == (c != 2)


@settings(max_examples=100)
@given(actions, cautions, flags)
def test_case_changes_are_not_recognised(a, c, p):
    for variant in (render(a, c, p).swapcase(), render(a, c, p).lower()):
        assume(not _in_language(variant))
        assert evaluate(variant, "eos", a)["status"] == "UNCERTIFIED"


@settings(max_examples=100)
@given(st.sampled_from(rubric.REFUSALS), actions, whitespace, st.sampled_from(rubric.FINISH_REASONS[:2]))
def test_declared_refusals_are_recognised_and_never_succeed(text, expected, ws, finish):
    r = evaluate(ws + text + ws, finish, expected)
    assert r["recognized"] and r["refusal"] and not r["rubric_success"]
    assert r["unsupported_certainty"] is False and r["action"] is None
