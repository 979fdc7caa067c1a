"""Synthetic sample clips: the dataset of the tests, and of the `cpu` profile when the real sample
clips (scripts/make_real_clips.py) cannot be made.

    python -m scripts.make_sample_videos --out data/synthetic [--count 128] [--seed 0]

H.264 clips made with PyAV, with what a video VAE meets in real footage: multi-scale textures,
gradients, moving and rotating shapes, camera pans and zooms, sensor noise; varied sizes, aspect
ratios (landscape, portrait, square) and frame rates. Writes `index.jsonl` beside them (the
format of scripts/build_index.py). Deterministic for a seed; a few seconds for the default set.
Each file is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import av
import numpy as np

from training.base.files import unique_temporary
from training.base.prepare_once import mark_prepared

SIZES = ((96, 128), (128, 96), (96, 96), (80, 144), (112, 160))  # (height, width)
FRAME_RATES = (24, 25, 30)


def texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """H,W,3 in [0, 1]: smooth colour field plus detail at three scales."""
    out = np.zeros((height, width, 3), np.float32)
    for scale, weight in ((8, 0.5), (24, 0.3), (64, 0.2)):
        coarse = rng.random((max(2, height * scale // 256), max(2, width * scale // 256), 3)).astype(np.float32)
        ys = np.linspace(0, coarse.shape[0] - 1, height)
        xs = np.linspace(0, coarse.shape[1] - 1, width)
        y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
        y1, x1 = np.minimum(y0 + 1, coarse.shape[0] - 1), np.minimum(x0 + 1, coarse.shape[1] - 1)
        fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
        top = coarse[y0][:, x0] * (1 - fx) + coarse[y0][:, x1] * fx
        bottom = coarse[y1][:, x0] * (1 - fx) + coarse[y1][:, x1] * fx
        out += weight * (top * (1 - fy) + bottom * fy)
    return out


def render_clip(seed: int, n_frames: int, height: int, width: int) -> np.ndarray:
    """n_frames,H,W,3 uint8: a textured background seen by a panning, zooming camera, with
    moving and rotating shapes and a little noise."""
    rng = np.random.default_rng(seed)
    world = texture(rng, height * 2, width * 2)
    pan = rng.uniform(-1.5, 1.5, 2)
    zoom_rate = rng.uniform(-0.004, 0.004)
    shapes = [
        {"colour": rng.random(3).astype(np.float32), "size": rng.uniform(0.1, 0.25) * min(height, width),
         "pos": rng.uniform(0.2, 0.8, 2) * (height, width), "vel": rng.uniform(-2.5, 2.5, 2),
         "angle": rng.uniform(0, math.pi), "spin": rng.uniform(-0.15, 0.15), "kind": int(rng.integers(3))}
        for _ in range(int(rng.integers(2, 5)))
    ]
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    frames = np.empty((n_frames, height, width, 3), np.uint8)
    for t in range(n_frames):
        zoom = 1 + zoom_rate * t
        cy = height / 2 + pan[0] * t + height / 2
        cx = width / 2 + pan[1] * t + width / 2
        sy = np.clip(((y - height / 2) / zoom + cy).astype(int), 0, 2 * height - 1)
        sx = np.clip(((x - width / 2) / zoom + cx).astype(int), 0, 2 * width - 1)
        image = world[sy, sx].copy()
        for shape in shapes:
            shape["pos"] += shape["vel"]
            shape["angle"] += shape["spin"]
            for axis, limit in enumerate((height, width)):
                if not 0 <= shape["pos"][axis] < limit:
                    shape["vel"][axis] *= -1
                    shape["pos"][axis] = np.clip(shape["pos"][axis], 0, limit - 1)
            dy, dx = y - shape["pos"][0], x - shape["pos"][1]
            c, s = math.cos(shape["angle"]), math.sin(shape["angle"])
            u, v = c * dx + s * dy, -s * dx + c * dy
            if shape["kind"] == 0:
                inside = np.hypot(u, v * 1.6) < shape["size"]
            elif shape["kind"] == 1:
                inside = np.maximum(abs(u), abs(v)) < shape["size"] * 0.8
            else:
                inside = (abs(u) < shape["size"]) & (abs(v) < shape["size"] * 0.25)
            stripes = 0.85 + 0.15 * np.sign(np.sin(u[inside] / 3))[:, None]
            image[inside] = shape["colour"] * stripes
        image += rng.normal(0, 0.015, image.shape).astype(np.float32)
        frames[t] = (np.clip(image, 0, 1) * 255).astype(np.uint8)
    return frames


def write_clip(path: Path, frames: np.ndarray, fps, crf: int = 18) -> None:
    """H.264 at `fps` (an int or a Fraction), written under a temporary name and renamed when complete."""
    temporary = unique_temporary(path)  # hidden, no video suffix: a concurrent scan never reads it
    with av.open(str(temporary), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast"}
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    temporary.replace(path)


def make_sample_videos(out: Path, count: int = 128, seed: int = 0, n_frames: int = 40) -> list[Path]:
    """Writes the clips that are missing and (re)writes index.jsonl; existing clips are kept.
    Not safe for several processes at once on one folder: training goes through prepare_once."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records, paths = [], []
    for index in range(count):
        rng = random.Random(seed * 100_003 + index)
        height, width = SIZES[rng.randrange(len(SIZES))]
        fps = FRAME_RATES[rng.randrange(len(FRAME_RATES))]
        frames = n_frames + rng.randrange(0, 17)
        path = out / f"sample_{index:04d}.mp4"
        if not path.is_file():
            write_clip(path, render_clip(seed * 100_003 + index, frames, height, width), fps)
        paths.append(path)
        records.append({"path": path.name, "frames": frames, "fps": fps, "duration": round(frames / fps, 4),
                        "width": width, "height": height, "rotation": 0, "codec": "h264"})
    temporary = unique_temporary(out / "index.jsonl")
    temporary.write_text("".join(json.dumps(r) + "\n" for r in records))
    temporary.replace(out / "index.jsonl")
    mark_prepared(out)  # training with sample_data=synthetic uses a prepared folder as it is
    return paths
