"""The lab's stages over one run folder, each runnable alone (`rlhf sft|judge|ppo --run DIR`)
or all in order (`rlhf lab --out DIR`).

Run folder:

    run.json                what the run is (its identity) and which stages are complete
    corpus/                 inputs/, labels/, manifest.json (rlhf.corpus)
    base_model/             the embedded base, built here unless --model-dir is given
    sft/    state-*.pt.gz   final states of the protocol's three legs (+ .json sidecars with
                            SHA-256 and identity)
            checkpoints/    <leg>-NNNN.pt.gz: each leg's state after every epoch (SFT, judge) or
                            every `ppo.checkpoint_every` iterations (PPO)
            actor.safetensors(+.json)   final SFT adapters
            history.json, timings.json, resume_check.json
    judge/  the same for the judge (judge.safetensors)
    judge-1/ .. judge-(k-1)/   a judge ensemble's other members (reward designs 'ensemble-*'),
            each trained like the judge from its own seeds (`member_profile`)
    ppo/    the same for PPO (actor.safetensors, critic.safetensors, fingerprints.json; with the
            iterated judge also judge.safetensors, the judge as last refreshed)

Interrupt/resume protocol (SPEC §7), run by the lab and by tests_reproducibility:
stop after a boundary (SFT epoch 1, judge epoch 1, PPO iteration 40), resume from that state
to the end, run the same stage continuously to the end, and require the two final states to
be identical tensor by tensor. Nothing existing is overwritten.

Crash safety: a rerun of the same command after a crash (SIGKILL, power cut) at any
moment continues where the run stopped. `run.json` is checked first (a different profile,
revision, code, base model or CPU pin is refused); what a crash left half-written is swept
away (rlhf.io.sweep_incomplete); a leg whose final state exists is loaded, not recomputed; any
other leg continues from its last checkpoint, loaded with the same hash and identity checks as
a resume. Because a resume is exact, the final states are bit-identical to an uninterrupted
run's. Ctrl-C asks for a stop: the running leg saves a checkpoint at its next boundary and the
command exits saying how to continue.

One module per concern, each importing only those above it in this list:

    run        the run folder: its Context, opening it (prepared or hash-checked), run.json
    console    what the lab says: progress, epoch and iteration lines, warnings once each
    protocol   one resumable stage's legs, crash-safe, and their comparison
    stages     SFT, the judge (and an ensemble's members) and PPO through the protocol
    pipeline   the whole lab: every stage in order, skipping the complete ones

The names below are the lab's interface to the command line, the studies and the tests.
"""

from rlhf.lab.console import fired_warnings
from rlhf.lab.pipeline import run_lab, run_stages
from rlhf.lab.protocol import adopt_continuous_leg, adopt_evaluation, check_stop_after, resumable_states
from rlhf.lab.run import (
    RUN_FILE,
    Context,
    check_run_record,
    open_context,
    profile_device,
    read_context,
    refuse_foreign_folder,
    refuse_old_layout,
    stage_complete,
    stop_rules_identity,
)
from rlhf.lab.stages import (
    initial_fingerprints,
    judge_files,
    member_profile,
    member_stages,
    ppo_fingerprints,
    ppo_identity,
    ppo_roles,
    stage_judge,
    stage_judge_member,
    stage_ppo,
    stage_sft,
    train_role,
)

__all__ = [
    "RUN_FILE",
    "Context",
    "adopt_continuous_leg",
    "adopt_evaluation",
    "check_run_record",
    "check_stop_after",
    "fired_warnings",
    "initial_fingerprints",
    "judge_files",
    "member_profile",
    "member_stages",
    "open_context",
    "ppo_fingerprints",
    "ppo_identity",
    "ppo_roles",
    "profile_device",
    "read_context",
    "refuse_foreign_folder",
    "refuse_old_layout",
    "resumable_states",
    "run_lab",
    "run_stages",
    "stage_complete",
    "stage_judge",
    "stage_judge_member",
    "stage_ppo",
    "stage_sft",
    "stop_rules_identity",
    "train_role",
]
