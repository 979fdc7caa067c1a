"""Preview what the loader makes of a folder: `python -m training.data.preview DATA_ROOT --out
strips/`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from training.base.fast_exit import exit_now
from training.data.clips import ClipSpec, DataFailureError, VideoClipDataset
from training.data.decode import ClipError
from training.data.index import IndexFormatError, probe_video, read_index


def save_strip(video: torch.Tensor, path: Path, frames: int = 6) -> None:
    """A PNG of up to `frames` evenly spaced frames side by side."""
    from PIL import Image

    picks = np.linspace(0, video.shape[0] - 1, min(frames, video.shape[0])).round().astype(int)
    strip = torch.cat([video[i] for i in picks], dim=-1).permute(1, 2, 0).numpy()
    Image.fromarray(strip).save(path)


def preview(source: str, height: int, width: int, n_frames: int, samples: int | None, out: Path | None,
            data_root: str | None = None, seed: int = 0, min_delta: int = 1, max_delta: int = 1, loop_short: bool = False) -> dict:
    index = read_index(source, data_root)
    spec = ClipSpec(n_frames, height, width, min_delta, max_delta, loop_short_clips=loop_short)
    dataset = VideoClipDataset(index, spec, train=True, seed=seed, max_redraws=1)
    keys = [(0, i % len(index)) for i in range(samples)] if samples else [(0, i) for i in range(len(index))]
    report = {"files": [], "ok": 0, "skipped": {}}
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for number, key in enumerate(keys):
        i = key[1]
        entry = {"path": index.location(i), "status": "ok", "reason": None}
        try:
            entry.update({k: v for k, v in probe_video(index.lasting_path(i)).items() if k in ("width", "height", "rotation")})
            item = dataset[(number, i)] if samples else dataset[key]
            entry["shape"] = list(item["video"].shape)
            report["ok"] += 1
            if out:
                save_strip(item["video"], out / f"{number:04d}_{Path(entry['path']).stem}.png")
        except (ClipError, DataFailureError) as error:
            reason = error.reason if isinstance(error, ClipError) else str(error).split("failed: ")[-1].split(" x")[0]
            entry.update(status="skipped", reason=reason)
            report["skipped"][reason] = report["skipped"].get(reason, 0) + 1
        report["files"].append(entry)
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m training.data.preview", description="Preview the clips training will see.")
    parser.add_argument("source", help="folder, annotation JSON, or JSONL/CSV index")
    parser.add_argument("--data-root", help="folder the index paths are relative to (default: the index's folder)")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=720)
    parser.add_argument("--n-frames", type=int, default=13)
    parser.add_argument("--min-frame-delta", type=int, default=1)
    parser.add_argument("--max-frame-delta", type=int, default=1)
    parser.add_argument("--loop-short", action="store_true", help="loop clips shorter than needed instead of skipping")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--per-file", action="store_true", help="one clip per file (default)")
    group.add_argument("--samples", type=int, help="N random draws instead")
    parser.add_argument("--out", type=Path, help="write PNG strips here")
    parser.add_argument("--json", action="store_true", help="print one JSON summary")
    args = parser.parse_args(argv)
    try:
        report = preview(args.source, args.height, args.width, args.n_frames, args.samples, args.out, args.data_root,
                         min_delta=args.min_frame_delta, max_delta=args.max_frame_delta, loop_short=args.loop_short)
    except (IndexFormatError, DataFailureError) as error:
        print(f"error: {error}")
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for entry in report["files"]:
            detail = f"shape {entry.get('shape')}" if entry["status"] == "ok" else f"skipped: {entry['reason']}"
            size = f"{entry.get('width', '?')}x{entry.get('height', '?')} rot {entry.get('rotation', '?')}"
            print(f"{entry['status']:7s} {size:22s} {detail:28s} {entry['path']}")
        print(f"{report['ok']} ok, skipped: {report['skipped'] or 'none'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    exit_now(main())
