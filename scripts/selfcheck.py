"""Model self-check: builds every TAEHV variant, checks parallel and sequential agree, and runs a
round trip on a real clip (or a synthetic one when ../shared/data/videos is absent).

    python -m scripts.selfcheck [--video PATH]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from models.taehv import TAEHV, VARIANTS, parameter_count
from training.base.fast_exit import exit_now
from training.data.decode import read_clip, resize_and_crop

SHARED_VIDEO = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "videos" / "bear.mp4"


def read_video(path: Path, n_frames: int, size: int) -> torch.Tensor:
    """First n_frames of a video as 1,T,3,size,size in [0, 1] (centre crop), via the data pipeline."""
    frames, _, _ = read_clip(path, n_frames, n_frames, 1, 1, random.Random(0), loop_short=True, cover=(size, size))
    video = resize_and_crop(torch.from_numpy(frames).permute(0, 3, 1, 2), size, size, rng=None)[0]
    return video[None].float() / 255


def synthetic_clip(n_frames: int, size: int) -> torch.Tensor:
    """A moving colour gradient, 1,T,3,size,size in [0, 1]."""
    t = torch.arange(n_frames)[:, None, None, None]
    y = torch.linspace(0, 1, size)[None, None, :, None]
    x = torch.linspace(0, 1, size)[None, None, None, :]
    channels = [((x + y + 0.05 * t) % 1.0), ((x - 0.03 * t) % 1.0), (y.expand(n_frames, 1, size, size))]
    return torch.cat([c.expand(n_frames, 1, size, size) for c in channels], 1)[None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--video", type=Path, default=SHARED_VIDEO, help="clip for the round trip")
    args = parser.parse_args()
    torch.manual_seed(0)
    failures = 0
    print(f"{'variant':16s} {'params':>11s} {'latent':>18s} {'decoded':>16s} {'max |par-seq|':>14s}")
    for name in VARIANTS:
        model = TAEHV(name).eval()
        size = 16 * model.patch_size
        video = torch.rand(1, 9, 3, size, size)
        with torch.no_grad():
            latents = model.encode_video(video)
            decoded = model.decode_video(latents)
            difference = max(
                (latents - model.encode_video(video, parallel=False)).abs().max().item(),
                (decoded - model.decode_video(latents, parallel=False)).abs().max().item(),
            )
        ok = difference < 1e-4 and decoded.shape[1] == model.decoded_frame_count(latents.shape[1])
        failures += not ok
        print(
            f"{name:16s} {parameter_count(model):11,d} {str(tuple(latents.shape[1:])):>18s} "
            f"{str(tuple(decoded.shape[1:3])):>16s} {difference:14.2e} {'ok' if ok else 'FAIL'}"
        )
    clip = read_video(args.video, 12, 64) if args.video.is_file() else synthetic_clip(12, 64)
    source = args.video if args.video.is_file() else "synthetic clip"
    model = TAEHV("taehv").eval()
    start = time.perf_counter()
    with torch.no_grad():
        reconstruction = model(clip)
    seconds = time.perf_counter() - start
    print(
        f"round trip of {source}: {tuple(clip.shape)} -> {tuple(reconstruction.shape)} in {seconds:.2f}s "
        "(untrained weights: train or load a checkpoint for meaningful quality)"
    )
    print("self-check " + ("passed" if failures == 0 else f"FAILED for {failures} variant(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    exit_now(main())
