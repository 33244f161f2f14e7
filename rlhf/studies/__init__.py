"""Studies over whole lab runs (docs/studies.md), one concern per module:

    seeds           `rlhf seeds`: running a multi-seed study; its rows, invariants and seeds.json
    derivation      what a study run changes in its profile: the training seeds of run i
    statistics      the across-seed statistics (mean, SD, Student-t interval, sign test)
    changed_answer  the per-token view of a held-out answer that PPO changed
    sft_budget      `rlhf choose-sft-budget`: the cut SFT budget, chosen on validation prompts only
    base            `rlhf base-study`: can the embedded base carry the lab?

A study's page is written by rlhf.report.study, a run profile's TOML by rlhf.config.profile_text_with.
"""


class StudyError(ValueError):
    """A study folder or its arguments are not what the study needs."""
