"""Command line of training/data/synthetic_clips.py (the library the training's first run calls):

    python -m scripts.make_sample_videos --out data/synthetic [--count 128] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.data import synthetic_clips
from training.data.synthetic_clips import make_sample_videos


def main() -> int:
    parser = argparse.ArgumentParser(description=synthetic_clips.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/synthetic"))
    parser.add_argument("--count", type=int, default=128)
    parser.add_argument("--frames", type=int, default=40, help="shortest clip length (clips vary up to +16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = make_sample_videos(args.out, args.count, args.seed, args.frames)
    print(f"{len(paths)} sample clips and index.jsonl in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
