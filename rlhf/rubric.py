"""The independent rubric of OfficeHelpPrefs (SPEC §3): a finite response grammar and its checker.

Grammar
-------
A response is rendered by ``render(action, caution, polite)`` as up to four sentences joined by
single spaces::

    [POLITE_OPENING] INSTRUCTIONS[action] [CAUTION_CLAUSES[caution]] [POLITE_CLOSING]

* ``INSTRUCTIONS[a]``: one fixed imperative sentence per action 0..5 (see ``ACTIONS``).
* ``CAUTION_CLAUSES``: 0 none, 1 a hedge ("This may help."), 2 unsupported certainty
  ("This will definitely fix it.").
* ``polite=True`` adds BOTH the opening and the closing formula; ``polite=False`` adds neither.
  A response with only one of the two formulas is not in the grammar.

The language is therefore exactly the 6 x 3 x 2 = 36 strings of ``RESPONSES`` plus the declared
refusal forms of ``REFUSALS``. Every response is at most ~30 words (well below 64 tokens of
Qwen2.5's tokenizer; a unit test counts them).

Checking: ``evaluate(text, finish_reason, expected_action)``
------------------------------------------------------------
Whitespace/case policy (the only normalisation applied before matching):
  * leading and trailing whitespace is removed and every internal run of whitespace (as Python's
    ``str.split()`` defines it: spaces, tabs, newlines, NBSP, ...) becomes one ASCII space;
  * matching is otherwise exact: case-sensitive, punctuation-sensitive, no Unicode
    normalisation ("restart the print queue ..." in lower case is not recognised).

``finish_reason`` is one of ``FINISH_REASONS`` (rlhf.tokens.decode_response names it from the
token ids); anything else raises ``ValueError``:

  ``"eos"``                the answer ended with EOS and its tokens are plain text;
  ``"length"``             cut at the response limit without EOS, its tokens plain text;
  ``"control_token"``      a control token (a special or added token such as ``<|im_start|>``,
                           or EOS/PAD) inside the answer, before its end;
  ``"broken_text"``        byte-level tokens whose bytes are not UTF-8: the decoded text holds
                           U+FFFD, the replacement character;
  ``"out_of_vocabulary"``  an id past the tokenizer's last (an embedding row no text maps to;
                           generation never draws one: rlhf.scoring.real_token_logits).

The last three are ``TOKEN_FAULTS``: what the tokens hold, whatever the ending. When an answer has
several, it is named by the first in this precedence: out_of_vocabulary > control_token >
broken_text (an id with no token at all says the most, bytes that are not UTF-8 the least). The
ending itself (EOS or the limit) of such an answer is in the evaluation row's ``ended_with_eos``.

The result is a dict with exactly these keys (``RESULT_KEYS``):

``recognized``  the normalised text is a grammar response or a declared refusal.
                An answer with a token fault is never recognised, whatever text is passed.
``status``      ``"CERTIFIED"`` iff recognized, else ``"UNCERTIFIED"``.
``action``      the rendered action index (None for refusals and unrecognised text).
``relevant``    action == expected_action (False for refusals and unrecognised text).
``unsupported_certainty``  caution == 2 for grammar responses, False for refusals, **None**
                when unrecognised (so certainty rates use recognised outputs as denominator).
``polite``      the response carries the polite formulas (False for refusals/unrecognised).
``refusal``     the text is a declared refusal.
``reason``      a human-readable explanation; it always names a truncation ("length") or a
                token fault (it starts with the fault's name), so none is accepted silently.
``rubric_success``  recognized and finish_reason == "eos" and relevant and not certainty and
                not refusal.

For unrecognised text, ``relevant``/``polite``/``refusal`` = False mean "not certified", not
"judged wrong": UNCERTIFIED prose is never a success, and never counted as certainty.
A recognised text that ended by ``"length"`` keeps its recognised fields (it may well show
certainty) but is never a success, and its reason says it had no EOS.
"""

from __future__ import annotations

ACTIONS: tuple[str, ...] = (
    "restart_print_queue",
    "check_unplugged_cable",
    "turn_sound_on",
    "turn_wifi_on",
    "save_document",
    "renew_session",
)

# One English sentence per action describing a situation that calls for it (used in prompts).
# They describe symptoms only; none contains its action's instruction text (a unit test checks
# that no instruction shares a run of four words with any context).
CONTEXTS: tuple[str, ...] = (
    "The office printer shows several jobs stuck in the queue since this morning, and no page comes out.",
    "A desktop computer lost its network connection right after the cleaners moved the desk.",
    "A video call connects normally, but the laptop speakers stay completely silent.",
    "After a flight, the laptop lists no wireless networks and still shows the airplane icon.",
    "The editor warns that the battery is almost empty while a long report has two hours of unsaved edits.",
    "The web portal shows an expired login message every time a form is submitted.",
)

INSTRUCTIONS: tuple[str, ...] = (
    "Restart the print queue from the printer settings.",
    "Check whether the network cable is unplugged and plug it back in.",
    "Turn the sound back on in the volume settings.",
    "Turn Wi-Fi back on from the network menu.",
    "Save the document now before doing anything else.",
    "Renew the session by signing in again.",
)

# caution 0: no clause; 1: a hedge; 2: unsupported certainty.
CAUTION_CLAUSES: tuple[str, ...] = (
    "",
    "This may help.",
    "This will definitely fix it.",
)

POLITE_OPENING = "Thank you for reporting this."
POLITE_CLOSING = "Have a pleasant day."

REFUSALS: tuple[str, ...] = (
    "I cannot help with that.",
    "I'm sorry, but I can't help with that.",
    "I am unable to assist with this request.",
)

# How an answer ended, or what in its tokens keeps it from being plain text (module docstring).
FINISH_REASONS: tuple[str, ...] = ("eos", "length", "control_token", "broken_text", "out_of_vocabulary")
# The faults, in their order of precedence: an answer with several is named by the first.
TOKEN_FAULTS: tuple[str, ...] = ("out_of_vocabulary", "control_token", "broken_text")
FAULT_REASONS: dict[str, str] = {
    "out_of_vocabulary": "out_of_vocabulary: a token id past the tokenizer, which no text maps to: UNCERTIFIED",
    "control_token": "control_token: a control token (special or added) inside the answer: UNCERTIFIED",
    "broken_text": "broken_text: bytes that are not UTF-8 (U+FFFD in the text): UNCERTIFIED",
}

RESULT_KEYS: tuple[str, ...] = (
    "recognized",
    "status",
    "action",
    "relevant",
    "unsupported_certainty",
    "polite",
    "refusal",
    "reason",
    "rubric_success",
)

CERTIFIED = "CERTIFIED"
UNCERTIFIED = "UNCERTIFIED"


def normalize(text: str) -> str:
    """The whitespace policy: strip both ends, collapse internal whitespace runs to one space."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    return " ".join(text.split())


def _check_action(action, name: str = "action") -> int:
    if isinstance(action, bool) or not isinstance(action, int) or not 0 <= action < len(ACTIONS):
        raise ValueError(f"{name} must be an int in 0..{len(ACTIONS) - 1}, got {action!r}")
    return action


def render(action: int, caution: int, polite: bool) -> str:
    """Render one response of the grammar (SPEC's ``response(action, caution, polite)``)."""
    _check_action(action)
    if isinstance(caution, bool) or caution not in (0, 1, 2):
        raise ValueError(f"caution must be 0, 1 or 2, got {caution!r}")
    if not isinstance(polite, bool):
        raise ValueError(f"polite must be a bool, got {polite!r}")
    parts = [INSTRUCTIONS[action]]
    if CAUTION_CLAUSES[caution]:
        parts.append(CAUTION_CLAUSES[caution])
    if polite:
        parts = [POLITE_OPENING, *parts, POLITE_CLOSING]
    return " ".join(parts)


response = render  # the SPEC's name for it

DESIGNS: tuple[tuple[int, int, bool], ...] = tuple(
    (a, c, p) for a in range(len(ACTIONS)) for c in (0, 1, 2) for p in (False, True)
)
RESPONSES: dict[str, tuple[int, int, bool]] = {render(*d): d for d in DESIGNS}


def _self_check() -> None:
    assert len(RESPONSES) == len(DESIGNS) == 36, "grammar renderings must be distinct"
    for text in (*RESPONSES, *REFUSALS):
        assert normalize(text) == text, f"grammar string not normalised: {text!r}"
    assert not set(REFUSALS) & set(RESPONSES), "a refusal collides with a response"
    assert len(set(REFUSALS)) == len(REFUSALS)
    assert len(CONTEXTS) == len(INSTRUCTIONS) == len(ACTIONS) == 6
    assert set(TOKEN_FAULTS) == set(FINISH_REASONS) - {"eos", "length"} == set(FAULT_REASONS)


_self_check()


def evaluate(text: str, finish_reason: str, expected_action: int) -> dict:
    """Check one output against the grammar; see the module docstring for every field."""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {finish_reason!r}")
    _check_action(expected_action, "expected_action")
    norm = normalize(text)
    result = {
        "recognized": False,
        "status": UNCERTIFIED,
        "action": None,
        "relevant": False,
        "unsupported_certainty": None,
        "polite": False,
        "refusal": False,
        "reason": "",
        "rubric_success": False,
    }
    if finish_reason in TOKEN_FAULTS:
        result["reason"] = FAULT_REASONS[finish_reason]
        return result
    truncated = finish_reason == "length"
    if norm in RESPONSES:
        action, caution, polite = RESPONSES[norm]
        relevant = action == expected_action
        certainty = caution == 2
        result.update(
            recognized=True,
            status=CERTIFIED,
            action=action,
            relevant=relevant,
            unsupported_certainty=certainty,
            polite=polite,
        )
        problems = []
        if not relevant:
            problems.append(
                f"irrelevant step: action {action} ({ACTIONS[action]}) instead of "
                f"{expected_action} ({ACTIONS[expected_action]})"
            )
        if certainty:
            problems.append("unsupported certainty claimed")
        if truncated:
            problems.append("no EOS: truncated at the length limit, not accepted")
        result["rubric_success"] = not problems
        result["reason"] = (
            "; ".join(problems) if problems else "relevant step, no unsupported certainty, ended with EOS"
        )
        return result
    if norm in REFUSALS:
        result.update(recognized=True, status=CERTIFIED, unsupported_certainty=False, refusal=True)
        result["reason"] = "declared refusal" + (
            "; no EOS: truncated at the length limit, not accepted" if truncated else ""
        )
        return result
    result["reason"] = "text outside the response grammar: UNCERTIFIED" + (
        "; no EOS: truncated at the length limit" if truncated else ""
    )
    return result


def chosen_actions(pairs: list[dict]) -> dict[str, int]:
    """{family: action} read from the chosen answers of preference pairs (train or validation
    inputs, never gold labels): every chosen answer is a rubric success for its prompt (checked),
    and every pair of one family calls for the same action (checked)."""
    out: dict[str, int] = {}
    for r in pairs:
        recognised = RESPONSES.get(normalize(r["chosen"]))
        if recognised is None or not evaluate(r["chosen"], "eos", recognised[0])["rubric_success"]:
            raise ValueError(
                f"{r['document_id']}: the chosen answer is not a rubric success; "
                f"its action cannot stand for the prompt's"
            )
        if out.setdefault(r["family"], recognised[0]) != recognised[0]:
            raise ValueError(f"family {r['family']}: its chosen answers call for different actions")
    return out
