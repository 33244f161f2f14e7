"""The over-optimisation frontier (SPEC §12): gold and proxy against sqrt(KL) for PPO arms and
best-of-n, chosen on validation prompts, confirmed once on test.

`rlhf frontier --out DIR [--revision r002] [--sft-budget sft-e6] [--n 3] [--workers W]`
`rlhf frontier --out DIR --confirm 5`     (after the study: the chosen point and the default on test)
`rlhf frontier --out DIR --summarise-to NEWDIR`   (the summary recomputed from stored measurements)

One module per concern, each importing only those above it in this list:

    arms          the arms (a reward design and a KL coefficient each, or DPO's or GRPO's settings)
                  and the study's settings
    methods       the arms that are not PPO: DPO and GRPO trained, checkpointed and resumed in the
                  arm's folder, their actor at each measured point
    runs          the run folders: a seed's SFT and judge, an arm's PPO from them, its actor at a checkpoint
    measure       the validation measurements: per seed the SFT policy, per arm every kept checkpoint
    selection     the stored measurements summarised: curves over seeds, fits, the grid's best c,
                  each arm's best point and the operating point chosen on validation
    study         the orchestration: the study's record, its seed folders, its tasks over worker
                  processes, an extension by new arms, and the summary recomputed into a new folder
    confirmation  the chosen point and the SPEC's default on fresh seeds, evaluated on test

Per training seed i (study seed 1 of rlhf.studies.derivation; the confirmation uses study seed 2,
so its seeds are fresh), DIR/seed-i is a lab run folder (its own profile.toml) where:

  1. SFT and the judge train once (`rlhf lab`'s stages, without the interrupt/resume protocol);
  2. seed-i/frontier/sft.json measures the SFT policy on the validation prompts: greedy gold and
     proxy (iteration 0 of every arm), best-of-n (n = 1..16 temperature-1 samples, the judge's
     favourite kept), the spread sigma of the judge's scores of one temperature-1 SFT sample per
     validation prompt, and mean and SD of its scores of one sample per train (rollout) prompt;
  3. every arm runs PPO (or its declared method, DPO or GRPO) from that same SFT and judge, in
     seed-i/arms/ARM (its own run folder and profile.toml, `Context.trained_in` = seed-i), keeping
     the checkpoint PPO saves every `ppo.checkpoint_every` iterations (DPO: every epoch); each
     checkpoint is measured on the validation prompts (seed-i/arms/ARM/validation/iter-NNNN.json:
     per-row answers kept).

Only `confirmation` reads test prompts. Everything else reads the learning view only: SFT, judge
and PPO train on it, and every measurement takes it (rlhf.studies.validation). The best (arm,
iteration) by mean validation gold over seeds is written to frontier.json before `--confirm` may
read test.

Crash-safe like `rlhf seeds`: each step writes its result whole and last, a rerun continues
where the study stopped, and a finished study (frontier.json there) recomputes nothing.
"""
