"""Write small synthetic H.264 clips (moving shapes over drifting gradients) for the CPU profiles.

    python -m scripts.make_synthetic_clips --out data/synthetic --count 48

Deterministic for a given --seed. Each clip is written to a temporary name and renamed when
complete, so an interrupted run never leaves a half-written clip behind.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import av
import numpy as np


def render_clip(rng: random.Random, n_frames: int, height: int, width: int) -> np.ndarray:
    """n_frames,H,W,3 uint8: a drifting colour gradient with a few moving, bouncing shapes."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.array([rng.random() for _ in range(3)], dtype=np.float32)
    tilt = np.array([rng.uniform(-1, 1) for _ in range(3)], dtype=np.float32)
    shapes = [
        {
            "colour": np.array([rng.random() for _ in range(3)], dtype=np.float32),
            "radius": rng.uniform(0.08, 0.22) * min(height, width),
            "pos": np.array([rng.uniform(0.2, 0.8) * height, rng.uniform(0.2, 0.8) * width]),
            "vel": np.array([rng.uniform(-3, 3), rng.uniform(-3, 3)]),
            "square": rng.random() < 0.5,
        }
        for _ in range(rng.randint(2, 4))
    ]
    frames = np.empty((n_frames, height, width, 3), dtype=np.uint8)
    for t in range(n_frames):
        phase = 0.05 * t
        image = base + 0.35 * np.stack(
            [np.sin((x * tilt[c] + y * (1 - abs(tilt[c]))) / 23.0 + phase + c) for c in range(3)], -1
        )
        for shape in shapes:
            shape["pos"] += shape["vel"]
            for axis, limit in enumerate((height, width)):
                if not 0 <= shape["pos"][axis] < limit:
                    shape["vel"][axis] *= -1
                    shape["pos"][axis] = min(max(shape["pos"][axis], 0), limit - 1)
            dy, dx = y - shape["pos"][0], x - shape["pos"][1]
            inside = (np.maximum(abs(dy), abs(dx)) if shape["square"] else np.hypot(dy, dx)) < shape["radius"]
            image[inside] = shape["colour"]
        frames[t] = (np.clip(image, 0, 1) * 255).astype(np.uint8)
    return frames


def write_clip(path: Path, frames: np.ndarray, fps: int = 24) -> None:
    temporary = path.with_name(path.stem + ".partial" + path.suffix)
    with av.open(str(temporary), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    temporary.replace(path)


def make_clips(out: Path, count: int, seed: int = 0, n_frames: int = 40, height: int = 96, width: int = 128) -> list[Path]:
    """Missing clips of the set are written; existing complete ones are kept."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = out / f"synthetic_{index:04d}.mp4"
        if not path.is_file():
            rng = random.Random(seed * 100_003 + index)
            write_clip(path, render_clip(rng, n_frames, height, width))
        paths.append(path)
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/synthetic"))
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = make_clips(args.out, args.count, args.seed, args.frames, args.height, args.width)
    print(f"{len(paths)} synthetic clips in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
