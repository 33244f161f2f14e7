"""Command line: `rlhf lab` (the main job) and one command per stage.

    rlhf prepare --out DIR [--revision r001]     corpus: inputs/, labels/, manifest.json
    rlhf build-embedded --out DIR [--seed 49]    the embedded base model and tokenizer
    rlhf fetch-model --out DIR                   download Qwen2.5-0.5B-Instruct (network needed)
    rlhf lab --out DIR [--profile embedded]      the whole lab in one run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rlhf.config import DEFAULT_PROFILE, PROFILES, load_profile


def cmd_prepare(args) -> int:
    from rlhf.corpus import prepare
    manifest = prepare(args.out, revision=args.revision)
    print(json.dumps(manifest["audit"], indent=1, sort_keys=True))
    print(f"corpus written to {args.out}")
    return 0


def cmd_build_embedded(args) -> int:
    from rlhf.embedded import build_embedded
    manifest = build_embedded(args.out, seed=args.seed)
    print(f"embedded base: {manifest['parameters']:,} parameters, built in "
          f"{manifest['build_seconds']} s -> {args.out}")
    return 0


def cmd_fetch_model(args) -> int:
    from rlhf.models import fetch_model
    profile = load_profile(args.profile)
    out = fetch_model(profile, args.out)
    print(f"downloaded {profile['model']['repo_id']}@{profile['model']['revision']} -> {out}")
    return 0


def ensure_corpus(run: Path, revision: str):
    """The run's corpus: prepared on the first call, loaded (hashes re-verified) afterwards."""
    from rlhf.corpus import load_corpus, prepare
    corpus_dir = run / "corpus"
    if not (corpus_dir / "manifest.json").is_file():
        prepare(corpus_dir, revision=revision)
    return load_corpus(corpus_dir)


def ensure_model_dir(run: Path, profile: dict, model_dir: str | None) -> Path:
    """The base model directory: given (`--model-dir`) or, for `embedded`, built into the run."""
    if model_dir:
        return Path(model_dir)
    if profile["model"]["kind"] != "embedded":
        raise SystemExit(f"profile {profile['name']} needs --model-dir DIR "
                         f"(get the weights with: rlhf fetch-model --out DIR)")
    from rlhf.embedded import build_embedded
    path = run / "base_model"
    if not (path / "config.json").is_file():
        build_embedded(path)
    return path


def cmd_lab(args) -> int:
    from rlhf.models import load_base
    t0 = time.perf_counter()
    run = Path(args.out)
    profile = load_profile(args.profile)
    corpus = ensure_corpus(run, args.revision)
    model_dir = ensure_model_dir(run, profile, args.model_dir)
    base = load_base(profile, model_dir)
    n = sum(p.numel() for p in base.model.parameters())
    print("corpus audit:")
    print(json.dumps(corpus.manifest["audit"], indent=1, sort_keys=True))
    print(f"base model: {profile['name']} from {model_dir}: {n:,} parameters, "
          f"vocab {len(base.tokenizer)}, EOS {base.eos_id}, PAD {base.pad_id}")
    print(f"lab folder: {run}  ({time.perf_counter() - t0:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="write the OfficeHelpPrefs corpus and its audit")
    p.add_argument("--out", required=True)
    p.add_argument("--revision", default="r001")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("build-embedded", help="build the embedded base model deterministically")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=49)
    p.set_defaults(func=cmd_build_embedded)

    p = sub.add_parser("fetch-model", help="download the pinned Qwen2.5-0.5B-Instruct revision")
    p.add_argument("--out", required=True)
    p.add_argument("--profile", default="qwen2.5-0.5b", choices=["qwen2.5-0.5b"])
    p.set_defaults(func=cmd_fetch_model)

    p = sub.add_parser("lab", help="the whole lab in one run")
    p.add_argument("--out", required=True)
    p.add_argument("--profile", default=DEFAULT_PROFILE, choices=PROFILES)
    p.add_argument("--model-dir", default=None, help="local model directory (qwen2.5-0.5b)")
    p.add_argument("--revision", default="r001")
    p.set_defaults(func=cmd_lab)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileExistsError, FileNotFoundError, ValueError, PermissionError) as err:
        print(f"rlhf {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
