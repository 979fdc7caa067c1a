"""The demo model's quality targets (issue: the embedded default must be a video model), printed
and written as JSON; a measurement, not a test.

    python -m scripts.benchmark_demo --model output/latest [--json benchmarks/demo.json]

1. Held-out real segments of the run (`inference.py --held-out-of`), at the run's training size
   and clip length: PSNR over all decoded frames >= 22 dB.
2. Real clips from other sources (../shared/data/videos, when present), 8 frames (2 latents) at
   64x64: PSNR over all decoded frames >= 17 dB, and no frame position (temporal slot) below 15 dB.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

import inference
from scripts.results import emit_result

REPO_ROOT = Path(__file__).resolve().parents[1]
OTHER_CLIPS = REPO_ROOT.parent / "shared" / "data" / "videos"
TARGETS = {"held_out_frame_mean_psnr": 22.0, "other_clips_frame_mean_psnr": 17.0, "other_clips_worst_position_psnr": 15.0}


def evaluate(model: Path, source: list[str], frames: int, height: int, width: int) -> dict:
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        code = inference.main(["--model", str(model), *source, "--frames", str(frames), "--height", str(height),
                               "--width", str(width), "--no-media", "--out", out])
        report = json.loads((Path(out) / "report.json").read_text()) if code == 0 else None
    if report is None:
        raise SystemExit(f"inference.py found no clip to evaluate in {source}")
    mean = report["mean"]
    return {"clips": sum(c["status"] == "ok" for c in report["clips"]), "frames": frames, "height": height, "width": width,
            "psnr": mean["psnr"], "frame_mean_psnr": mean["frame_mean_psnr"], "per_position_psnr": mean["per_position_psnr"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("output/latest"), help="the demo's run folder")
    parser.add_argument("--other-clips", type=Path, default=OTHER_CLIPS, help="real clips the run never saw")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    config = json.loads((args.model / "resolved_config.json").read_text())
    result = {"model": str(args.model.resolve()), "targets": TARGETS}
    result["held_out"] = evaluate(args.model, ["--held-out-of", str(args.model)], config["n_frames"], config["height"], config["width"])
    checks = {"held_out_frame_mean_psnr": result["held_out"]["frame_mean_psnr"]}
    if args.other_clips.is_dir():
        other = evaluate(args.model, ["--videos", str(args.other_clips)], 8, 64, 64)
        result["other_clips"] = other
        checks["other_clips_frame_mean_psnr"] = other["frame_mean_psnr"]
        checks["other_clips_worst_position_psnr"] = min(other["per_position_psnr"])
    else:
        result["other_clips"] = f"skipped: {args.other_clips} not present"
    result["met"] = {name: value >= TARGETS[name] for name, value in checks.items()}
    emit_result(result, args.json)
    for name, value in checks.items():
        print(f"{name}: {value:.2f} dB (target >= {TARGETS[name]:.0f}) {'met' if result['met'][name] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
