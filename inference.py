"""Evaluate a TAEHV model on real videos: round-trip PSNR per clip and overall, in report.json.

    python inference.py --model output/latest/final --videos /data/eval_clips --num-samples 20 \
        --frames 17 --height 480 --width 720 --out eval/

--model: a run folder (uses final/), a folder holding taehv.pth or taehv.safetensors, or a
public-format weight file (--variant when the file and a model_info.json beside it cannot tell).
--videos: files, folders, or an index (JSONL/CSV/annotation JSON) in the data pipeline's formats.
Unreadable clips are skipped with their reason; the exit code is non-zero only if nothing could
be evaluated.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from models.taehv import TAEHV
from training.dataset import ClipError, read_clip, read_index, resize_and_crop
from training.distill import aligned, psnr


def resolve_weights(model: Path) -> Path:
    """A weight file from a run folder, a checkpoint folder with an export, or the file itself."""
    if model.is_file():
        return model
    for folder in (model / "final", model):
        for name in ("taehv.safetensors", "taehv.pth"):
            if (folder / name).is_file():
                return folder / name
    raise FileNotFoundError(f"--model {model}: no taehv.safetensors or taehv.pth in it or in its final/ folder")


def clip_paths(sources: list[str]) -> list[Path]:
    paths: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir() or path.suffix in (".jsonl", ".csv", ".json"):
            index = read_index(path)
            paths += [index.path(i) for i in range(len(index))]
        else:
            paths.append(path)
    return paths


def code_version() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variant", help="TAEHV variant, when the weight file alone cannot tell")
    parser.add_argument("--videos", nargs="+", required=True)
    parser.add_argument("--num-samples", type=int, help="evaluate at most this many clips")
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=720)
    parser.add_argument("--streaming", action="store_true", help="frame-by-frame path: memory constant in T")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    try:
        weights = resolve_weights(args.model)
        model = TAEHV.from_pretrained(weights, variant=args.variant).to(args.device).eval()
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    paths = clip_paths(args.videos)[: args.num_samples]
    clips, start = [], time.perf_counter()
    for path in paths:
        entry = {"path": str(path)}
        try:
            frames, _ = read_clip(path, -1, args.frames, args.stride, args.stride, random.Random(0), loop_short=False,
                                  cover=(args.height, args.width))
        except ClipError as error:
            clips.append({**entry, "status": "skipped", "reason": error.reason})
            continue
        video = resize_and_crop(torch.from_numpy(frames).permute(0, 3, 1, 2), args.height, args.width, rng=None)
        video = video[None].to(args.device).float() / 255
        with torch.no_grad():
            latents = model.encode_video(video, parallel=not args.streaming)
            decoded = model.decode_video(latents, parallel=not args.streaming)
        target = aligned(video, decoded)
        per_frame = [psnr(decoded[:, t], target[:, t]).item() for t in range(decoded.shape[1])]
        clips.append({**entry, "status": "ok", "frames": decoded.shape[1], "psnr": psnr(decoded, target).item(),
                      "per_frame_psnr": per_frame})
    evaluated = [c for c in clips if c["status"] == "ok"]
    report = {
        "model": {"path": str(weights), "variant": model.variant, "args": model.args.to_json_dict(), "code_version": code_version()},
        "inputs": {"videos": args.videos, "frames": args.frames, "stride": args.stride, "height": args.height,
                   "width": args.width, "streaming": args.streaming, "device": args.device},
        "clips": clips,
        "mean": {"psnr": sum(c["psnr"] for c in evaluated) / len(evaluated) if evaluated else None},
        "seconds": round(time.perf_counter() - start, 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    for clip in clips:
        detail = f"{clip['psnr']:.2f} dB" if clip["status"] == "ok" else f"skipped: {clip['reason']}"
        print(f"{detail:24s} {clip['path']}")
    mean = report["mean"]["psnr"]
    print(f"{len(evaluated)} of {len(clips)} clips evaluated; mean PSNR " + (f"{mean:.2f} dB" if evaluated else "n/a")
          + f"; report {args.out / 'report.json'}")
    return 0 if evaluated else 1


if __name__ == "__main__":
    sys.exit(main())
