"""Command line of training/data/real_clips.py (the library the training's first run calls):

    python -m scripts.make_real_clips --out data/real [--short-side 144] [--segment-frames 12]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from training.data import real_clips
from training.data.real_clips import SourceClipsMissing, make_real_clips


def main() -> int:
    parser = argparse.ArgumentParser(description=real_clips.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/real"))
    parser.add_argument("--short-side", type=int, default=144, help="shorter side of the written clips in pixels")
    parser.add_argument("--segment-frames", type=int, default=12, help="frames per segment")
    args = parser.parse_args()
    try:
        paths = make_real_clips(args.out, args.short_side, args.segment_frames)
    except SourceClipsMissing as error:
        print(f"error: {error}")
        return 1
    print(f"{len(paths)} real clips and index.jsonl in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
