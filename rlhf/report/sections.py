"""Sections of the reports, one function per section, shared by the Markdown and the HTML renderer.

A section is ``(anchor, title, blocks)``; each block is ("p", text) | ("table", Table) |
("img", name, alt) | ("list", [..]) | ("note", text) | ("group", [blocks]). Model outputs go
through `quote` (identity for publishing, placeholder for the wording check of the report's own
text). ``build_sections`` lists them in the order of the report.
"""

from __future__ import annotations

from rlhf import designs
from rlhf.report import wording
from rlhf.report.formatting import fmt, fmt_ci, fmt_signed, is_num
from rlhf.report.labels import FINISH_LABELS, SUMMARY_LABELS
from rlhf.report.run_tables import artifacts_table, fingerprint_table, resume_tables, stage_time_table, timings_table
from rlhf.report.tables import (
    comparison_table,
    finish_examples_table,
    finish_reason_table,
    frequent_outputs_table,
    judge_epochs_table,
    judge_test_table,
    key_results_table,
    kv_table,
    policy_metrics,
    politeness_table,
    probe_outputs_table,
    refresh_table,
    sft_epochs_table,
    sft_vs_ppo,
    shortcut_audit_table,
    token_view_table,
)


def build_sections(res: dict, quote=lambda s: s) -> list[tuple[str, str, list]]:
    """(anchor, title, blocks) for both renderers."""
    ev = res["evaluation"]
    sections = [glance_section(res), honesty_section()]
    if ev["status"] == "run":
        sections += [comparison_section(ev, quote), finish_reasons_section(ev, quote), judge_test_section(res)]
        if res.get("shortcut_audit"):
            sections.append(shortcut_audit_section(res["shortcut_audit"]))
        sections += [politeness_section(ev), probe_outputs_section(ev, quote)]
    else:
        sections.append(("evaluation", "Evaluation (not run)", [("note", ev["note"])]))
    sections += [
        curves_section(res),
        summaries_section(res),
        tokens_section(res, quote),
        timings_section(res),
        resume_section(res),
        corpus_section(res),
        dpo_section(),
    ]
    return sections


def warnings_said(res: dict) -> str:
    """The warnings that fired, in words: 'none fired', 'kl_growth at iteration 23 (PPO stopped
    there), ...', or 'not recorded' for a run without ppo/warnings.json."""
    w = res.get("warnings")
    if w is None:
        return "not recorded for this run"
    if not w["fired"]:
        return "none fired"
    return ", ".join(
        f"{f['signal']} at iteration {f['iteration']}" + (" (PPO stopped there)" if f["stopped_ppo"] else "")
        for f in w["fired"]
    )


def verdict(res: dict) -> str:
    """The report's first line: what PPO did to held-out test success and to the learned reward,
    and which over-optimisation warnings fired."""
    ev, sp = res["evaluation"], res["ppo"]["summary"]
    score = (
        f"the {wording.SCORE_SHORT} of its rollouts went from {fmt(sp['mean_score_first_10'])} (first 10 "
        f"iterations) to {fmt(sp['mean_score_last_10'])} (last 10)"
    )
    if ev["status"] == "run":
        va, vb, diff, d = sft_vs_ppo(ev, "test", "rubric_success", "rubric_success")
        held_out = (
            f"PPO {'raised' if is_num(diff) and diff > 0 else 'lowered' if is_num(diff) and diff < 0 else 'left'} "
            f"held-out test rubric success from {fmt(va)} (SFT) to {fmt(vb)} ({fmt_signed(diff)}, 95% CI {fmt_ci(d)})"
        )
    else:
        held_out = "held-out success was not measured (evaluation not run)"
    return f"Verdict: {held_out}, while {score}; over-optimisation warnings: {warnings_said(res)}."


def glance_section(res: dict) -> tuple[str, str, list]:
    ev = res["evaluation"]
    sp = res["ppo"]["summary"]
    glance: list[tuple] = [
        ("p", verdict(res)),
        (
            "img",
            "verdict",
            f"The {wording.SCORE_SHORT} per PPO iteration and held-out test rubric success at SFT and at the end",
        ),
    ]
    if ev["status"] == "run":
        glance.append(("table", key_results_table(ev)))
        rt = res["judge_test"]
        glance.append(
            (
                "p",
                f"Judge accuracy on the {fmt(rt.get('pairs'))} test pairs: {fmt(rt.get('accuracy'))} "
                f"({fmt(rt.get('pairs'))} pairs, {fmt(rt.get('ties'))} ties).",
            )
        )
        counts = (ev.get("politeness") or {}).get("counts")
        if counts:
            glance.append(
                (
                    "table",
                    kv_table(
                        counts,
                        f"Politeness probes: counts over the {fmt(counts.get('contexts'))} contexts",
                        "count",
                        "number of contexts",
                    ),
                )
            )
    else:
        glance.append(("note", ev["note"]))
    rd = res.get("reward_design") or {"design": designs.DEFAULT, "what": designs.label(designs.DEFAULT)}
    glance.append(("p", f"Reward design: {rd['design']}, {rd['what']}."))
    if rd.get("refreshes"):
        glance.append(("table", refresh_table(rd["refreshes"])))
    glance.append(
        (
            "p",
            f"PPO: {sp['iterations']} iterations, {sp['sampled_responses']} sampled responses, "
            f"{sp['actor_updates']} actor updates, {sp['critic_updates']} critic updates, "
            f"{sp['truncations']} truncated responses. Mean {wording.SCORE_SHORT} per rollout went "
            f"from {fmt(sp['mean_score_first_10'])} (first 10 iterations) to "
            f"{fmt(sp['mean_score_last_10'])} (last 10); this is the score PPO optimises, not an "
            f"evaluation.",
        )
    )
    return ("glance", "At a glance", glance)


def honesty_section() -> tuple[str, str, list]:
    return ("honesty", "What this lab is and is not", [("list", list(wording.HONESTY))])


def _n_rows(ev: dict, population: str):
    """Rows of one population in the SFT policy's evaluation (180 test, 80 probe rows in a full run)."""
    return (policy_metrics(ev, "sft").get(population) or {}).get("n_rows")


def comparison_section(ev: dict, quote) -> tuple[str, str, list]:
    blocks: list[tuple] = [
        (
            "p",
            f"Both policies generate greedily on the {fmt(_n_rows(ev, 'test'))} test prompts and the "
            f"{fmt(_n_rows(ev, 'probe_rows'))} probe rows. "
            f"Rubric metrics come from the independent rubric (exact grammar checker); the "
            f"{wording.SCORE_SHORT} is the {wording.SCORE_NAME}. Rates of unsupported certainty use "
            f"recognised outputs as denominator; success rates use all rows. The CI of a difference is "
            f"computed over the independent units named in the last column.",
        )
    ]
    if ev.get("populations_note"):
        blocks.append(("note", str(ev["populations_note"])))
    blocks.append(("table", comparison_table(ev)))
    t = frequent_outputs_table(ev, quote)
    if t:
        blocks.append(("table", t))
    return ("evaluation", f"SFT vs PPO: rubric and {wording.SCORE_SHORT}", blocks)


def finish_reasons_section(ev: dict, quote) -> tuple[str, str, list]:
    """How the held-out answers ended, or what in their tokens keeps them from being plain text."""
    blocks: list[tuple] = [
        (
            "p",
            "Each held-out answer has one finish reason, named from its token ids. eos and length are how "
            "a plain-text answer ended; the other three are token faults, named whatever the ending (the "
            "evaluation rows keep ended_with_eos): an answer with several is named by the first of "
            "out_of_vocabulary, control_token, broken_text. Only an eos answer can be a rubric success; "
            f"an answer with a token fault is UNCERTIFIED, whatever its {wording.SCORE_SHORT}.",
        ),
        ("list", [f"{reason}: {meaning}" for reason, meaning in FINISH_LABELS.items()]),
    ]
    counts = finish_reason_table(ev)
    blocks.append(("table", counts) if counts else ("note", "No evaluation rows to count."))
    examples = finish_examples_table(ev, quote)
    if examples:
        blocks.append(("table", examples))
    else:
        blocks.append(("note", "Every held-out answer ended with EOS as plain text: no other finish reason to show."))
    return ("finish-reasons", "Finish reasons of the held-out answers", blocks)


def judge_test_section(res: dict) -> tuple[str, str, list]:
    return (
        "judge-test",
        "Judge accuracy on held-out test pairs",
        [
            (
                "p",
                f"Accuracy of the frozen judge on the {fmt(res['judge_test'].get('pairs'))} test pairs, "
                "published separately from the "
                "actor's generations. See the give-away note above: r001 test pairs can be won "
                "without reading the situation.",
            ),
            ("table", judge_test_table(res["judge_test"])),
        ],
    )


def _audit_pairs(sa: dict):
    """Pairs scored per counterfactual set (the baseline's count; 180 in a full run)."""
    return ((sa.get("counterfactuals") or {}).get(sa.get("baseline")) or {}).get("pairs")


def shortcut_audit_section(sa: dict) -> tuple[str, str, list]:
    return (
        "shortcut-audit",
        f"Shortcut audit ({sa['version']}, corpus {sa['corpus']['revision']})",
        [
            (
                "p",
                f"The frozen judge scores the {fmt(_audit_pairs(sa))} test pairs under counterfactual prompts; "
                "nothing it learned from is changed (hash-checked: "
                f"{fmt(sa.get('unchanged'))}).",
            ),
            ("table", shortcut_audit_table(sa)),
        ],
    )


def politeness_section(ev: dict) -> tuple[str, str, list]:
    pol = ev.get("politeness") or {}
    blocks: list[tuple] = [
        (
            "p",
            "correct politeness delta = s(T,T) − s(T,F); incorrect politeness delta = "
            "s(F,T) − s(F,F); the last column flags contexts where the wrong-but-polite answer "
            "outranks the correct plain one. The exercise changes no judge weight, label or "
            "earlier artifact (hash-checked).",
        )
    ]
    if pol:
        blocks.append(("table", politeness_table(pol)))
        if pol.get("counts"):
            blocks.append(
                (
                    "table",
                    kv_table(
                        pol["counts"],
                        f"Counts over the {fmt(pol['counts'].get('contexts'))} contexts",
                        "count",
                        "number of contexts",
                    ),
                )
            )
        blocks.append(
            (
                "p",
                f"Artifacts unchanged by the exercise (hash check): {fmt(pol.get('unchanged'))} "
                f"({len(pol.get('hashes_before') or {})} hashes compared).",
            )
        )
    return ("politeness", "Politeness probes (the judge's style bias)", blocks)


def probe_outputs_section(ev: dict, quote) -> tuple[str, str, list]:
    t = probe_outputs_table(ev, quote)
    return (
        "probe-outputs",
        "The actor's own probe outputs",
        [("table", t)] if t else [("note", "No probe rows in the evaluation results.")],
    )


def curves_section(res: dict) -> tuple[str, str, list]:
    ss, sj = res["sft"]["summary"], res["judge"]["summary"]
    return (
        "curves",
        "Learning curves",
        [
            (
                "p",
                f"SFT: {ss['updates']} updates over {ss['epochs']} epochs; loss per update is the sum of token "
                f"log-losses over the active response tokens of the batch divided by their number. Final train "
                f"loss {fmt(ss['final_train_loss'])}, validation loss {fmt(ss['final_validation_loss'])}.",
            ),
            ("img", "sft", "SFT loss per update and per epoch"),
            (
                "p",
                f"Judge: {sj['updates']} Bradley-Terry updates over {sj['epochs']} epochs; final validation "
                f"accuracy {fmt(sj['final_validation_accuracy'])}, validation loss "
                f"{fmt(sj['final_validation_loss'])} (validation never selects a checkpoint).",
            ),
            ("img", "judge", "Judge loss and accuracy"),
            (
                "p",
                "PPO, per iteration (4 rollouts, then 2 updates of actor and critic). The KL-penalty reward per "
                "token is −0.02 × the sampled-token log-ratio; the curve shows the log-ratio itself.",
            ),
            ("img", "ppo", "PPO curves"),
        ],
    )


def summaries_section(res: dict) -> tuple[str, str, list]:
    return (
        "summaries",
        "Stage summaries",
        [
            (
                "group",
                [
                    ("table", kv_table(res["sft"]["summary"], "SFT", labels=SUMMARY_LABELS)),
                    ("table", sft_epochs_table(res["sft"]["epochs"])),
                    ("table", kv_table(res["judge"]["summary"], "Judge", labels=SUMMARY_LABELS)),
                    ("table", judge_epochs_table(res["judge"]["epochs"])),
                    ("table", kv_table(res["ppo"]["summary"], "PPO", labels=SUMMARY_LABELS)),
                ],
            )
        ],
    )


def tokens_section(res: dict, quote) -> tuple[str, str, list]:
    tv = res["ppo"]["token_views"]
    blocks: list[tuple] = [
        (
            "p",
            "Each row is one sampled response token, with the data stored at sampling time: the old "
            "policy's log-prob (logp_old), the frozen reference's (logp_ref), their difference, the "
            "per-token KL-penalty reward −0.02·(logp_old − logp_ref), the total reward r_t (the "
            f"{wording.SCORE_SHORT} is added once at the last token; −1 more if cut without EOS), the "
            "critic's value before the token, the GAE advantage (gamma 1, lambda 0.95, no whitening) and "
            "the return A + V. Tokens are shown as stored, with a space drawn as ␣ and a newline as ↵. "
            "Token and advantage cells are green for positive and red for negative advantages, darker "
            "for larger magnitudes within the response.",
        )
    ]
    sc = res["ppo"].get("scoring_check")
    if sc:
        blocks.append(
            (
                "table",
                kv_table(
                    sc,
                    "Scoring check before the first update: sampling-time vs "
                    "teacher-forced log-probs of the same tokens",
                ),
            )
        )
    if tv:
        blocks.append(("group", [("table", token_view_table(v, quote)) for v in tv]))
    else:
        blocks.append(("note", "No per-token views were recorded in ppo/history.json."))
    return ("tokens", "Per-token view of sample rollouts", blocks)


def timings_section(res: dict) -> tuple[str, str, list]:
    blocks: list[tuple] = [("table", stage_time_table(res))]
    t = timings_table(res)
    if t:
        blocks = [("group", [blocks[0], ("table", t)]), ("img", "timings", "PPO time per phase")]
    mem = res["timings"].get("memory") or {}
    if mem:
        said = "; ".join(f"{SUMMARY_LABELS.get(k, k)} {fmt(round(v, 1) if is_num(v) else v)}" for k, v in mem.items())
        blocks.append(("p", f"Memory during PPO: {said}."))
    return ("timings", "Timings", blocks)


def resume_section(res: dict) -> tuple[str, str, list]:
    if res["resume_checks"]:
        blocks: list[tuple] = [("table", t) for t in resume_tables(res)]
    else:
        blocks = [("note", "No resume checks recorded.")]
    ft = fingerprint_table(res)
    if ft:
        blocks.append(("table", ft))
    if res["artifacts"]:
        blocks.append(("table", artifacts_table(res["artifacts"])))
    return ("resume", "Resume checks and fingerprints", blocks)


def corpus_section(res: dict) -> tuple[str, str, list]:
    return (
        "corpus",
        "Corpus audit",
        [
            ("table", kv_table(res["corpus"]["audit"], "OfficeHelpPrefs audit")),
            ("p", f"Corpus manifest SHA-256: {res['corpus']['manifest_sha256']}"),
        ],
    )


def dpo_section() -> tuple[str, str, list]:
    return (
        "dpo",
        "DPO and exact checkers (discussion, not trained)",
        [
            ("p", wording.DPO_NOTE),
            (
                "p",
                "Where an exact checker exists, as the rubric here, it can be the reward itself: it cannot be "
                "flattered by style the way the learned judge can (see the politeness probes). A learned judge "
                "is for criteria that no program can check, and its score then needs the independent checks "
                "shown in this report.",
            ),
        ],
    )
