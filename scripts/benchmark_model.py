"""Encode and decode speed and peak memory of one TAEHV variant.

    python -m scripts.benchmark_model --variant taehv --height 320 --width 512 --frames 61 \
        --dtype bf16 --mode parallel --json out.json

Times are medians over --repeats runs after --warmup runs. Peak memory is CUDA's peak allocation
on GPU and the process's peak RSS growth on CPU (an upper bound that includes allocator slack).
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from models.taehv import TAEHV, VARIANTS
from scripts.results import emit_result
from training.base.fast_exit import exit_now

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def timed(fn, device: torch.device, warmup: int, repeats: int) -> tuple[float, torch.Tensor]:
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="taehv", choices=sorted(VARIANTS))
    parser.add_argument("--height", type=int, default=320)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--frames", type=int, default=61)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--mode", default="parallel", choices=["parallel", "sequential"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    model = TAEHV(args.variant).to(device=device, dtype=dtype).eval()
    video = torch.rand(args.batch, args.frames, 3, args.height, args.width, device=device, dtype=dtype)
    parallel = args.mode == "parallel"

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rss_before = peak_rss_mb()
    with torch.inference_mode():
        encode_s, latents = timed(lambda: model.encode_video(video, parallel=parallel), device, args.warmup, args.repeats)
        decode_s, decoded = timed(lambda: model.decode_video(latents, parallel=parallel), device, args.warmup, args.repeats)
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
        memory_kind = "cuda_max_allocated"
    else:
        peak_mb = peak_rss_mb() - rss_before
        memory_kind = "cpu_peak_rss_growth"

    frames_in, frames_out = args.batch * args.frames, args.batch * decoded.shape[1]
    result = {
        "variant": args.variant,
        "device": device_name(device),
        "torch": torch.__version__,
        "dtype": args.dtype,
        "mode": args.mode,
        "input": [args.batch, args.frames, 3, args.height, args.width],
        "latents": list(latents.shape),
        "decoded": list(decoded.shape),
        "encode_s": round(encode_s, 4),
        "decode_s": round(decode_s, 4),
        "encode_frames_per_s": round(frames_in / encode_s, 2),
        "decode_frames_per_s": round(frames_out / decode_s, 2),
        "peak_memory_mb": round(peak_mb, 1),
        "peak_memory_kind": memory_kind,
        "command": " ".join(["python -m scripts.benchmark_model", *sys.argv[1:]]),
    }
    emit_result(result, args.json)
    return 0


if __name__ == "__main__":
    exit_now(main())
