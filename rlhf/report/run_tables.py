"""The run's own tables in the report: what each stage and PPO phase cost, whether the interrupted
and resumed legs equal the continuous one, the roles' fingerprints and the artifacts' hashes."""

from __future__ import annotations

from rlhf.report.formatting import fmt, is_num, short_hash
from rlhf.report.labels import PHASE_LABELS, PPO_PHASES, STAGE_LABELS
from rlhf.report.tables import Table


def timings_table(res: dict) -> Table | None:
    tot = res["timings"].get("ppo_phase_totals_s")
    if not tot:
        return None
    loop = tot.get("iteration")
    n = res["ppo"]["summary"]["iterations"] or 1
    rows = []
    for ph in PPO_PHASES + tuple(k for k in tot if k not in PPO_PHASES):
        if ph not in tot:
            continue
        share = tot[ph] / loop if loop and ph != "iteration" else None
        rows.append([PHASE_LABELS.get(ph, ph), fmt(tot[ph], 2), fmt(tot[ph] / n, 4), fmt(share, 3)])
    if loop is not None:
        other = loop - sum(tot.get(p, 0) for p in PPO_PHASES if p != "iteration")
        rows.append(
            [
                "other (bookkeeping between phases)",
                fmt(other, 2),
                fmt(other / n, 4),
                fmt(other / loop if loop else None, 3),
            ]
        )
    return Table(
        ["PPO phase", "total s", "s per iteration", "share of loop"],
        rows,
        f"PPO time per phase over {n} iterations (the continuous run)",
    )


def stage_time_table(res: dict) -> Table:
    rows = []
    for s, t in res["timings"]["stages"].items():
        rows.append(
            [
                STAGE_LABELS.get(s, s),
                fmt(t.get("continuous_s", t.get("seconds")), 1),
                fmt(t.get("interrupted_and_resumed_s"), 1),
            ]
        )
    ev = res["timings"].get("evaluation_s")
    if isinstance(ev, dict):
        for k, v in ev.items():
            rows.append([f"evaluation: {k}", fmt(v, 1), "—"])
    elif is_num(ev):
        rows.append(["evaluation", fmt(ev, 1), "—"])
    return Table(["stage", "continuous run s", "interrupted + resumed s"], rows, "Wall-clock time per stage")


def resume_tables(res: dict) -> list[Table]:
    rows, hashes = [], []
    for s, rc in res["resume_checks"].items():
        rows.append(
            [
                STAGE_LABELS.get(s, s),
                fmt(rc.get("boundary")),
                (fmt(rc.get("identical")), "class:ok" if rc.get("identical") else "class:bad"),
                fmt(rc.get("tensors_compared")),
                fmt(rc.get("interrupted_and_resumed_s"), 1),
                fmt(rc.get("continuous_s"), 1),
            ]
        )
        for k in ("boundary", "resumed", "continuous"):
            hashes.append([STAGE_LABELS.get(s, s), f"state-{k}.pt.gz", rc.get(f"sha256_{k}", "—")])
    return [
        Table(
            [
                "stage",
                "stopped after",
                "resumed state identical to continuous",
                "tensors compared",
                "interrupted + resumed s",
                "continuous s",
            ],
            rows,
            "Interrupt/resume checks: the resumed and the continuous final states compared value by value",
        ),
        Table(
            ["stage", "state file", "SHA-256"],
            hashes,
            "SHA-256 of the saved state files (integrity of each file; equality of the states is "
            "established by the value-by-value comparison above, not by these file hashes)",
            cls="hashes",
        ),
    ]


def fingerprint_table(res: dict) -> Table | None:
    fp, chk = res.get("fingerprints"), res.get("fingerprint_checks")
    if not fp or not chk:
        return None
    rows = []
    for role, c in chk.items():
        rows.append(
            [
                role,
                short_hash(fp["before"][role].get("learned_sha256")),
                short_hash(fp["after"][role].get("learned_sha256")),
                fmt(c["learned_changed"]),
                {True: "must change", False: "must stay frozen", None: "may change (refreshed)"}[c["must_change"]],
                fmt(c["frozen_base_unchanged"]),
                (fmt(c["ok"]), "class:ok" if c["ok"] else "class:bad"),
            ]
        )
    return Table(
        ["role", "learned SHA-256 before PPO", "after PPO", "changed", "rule", "frozen base unchanged", "ok"],
        rows,
        "Role fingerprints around PPO (full hashes in results.json)",
    )


def artifacts_table(artifacts: dict) -> Table:
    return Table(
        ["artifact", "role", "SHA-256", "tensors"],
        [[k, fmt(v["role"]), v["sha256"] or "—", fmt(v["tensors"])] for k, v in artifacts.items()],
        "Final adapters and heads",
        cls="hashes",
    )
