"""The reference VAE's encode of one batch, in PyTorch's default layout and in channels_last_3d,
at a profile's shape: which `ref_vae_channels_last` the run should use on this machine.

    python -m scripts.benchmark_teacher --profile h100 --json teacher.json   # make gpu-check runs this

The teacher is the family's published architecture with random weights (the layout's speed does
not depend on the values), in the run's precision (bf16 on a GPU), with cuDNN autotuning as the
profile sets it. Times are medians of --repeats encodes after --warmup. `--tiny` uses the tiny test
config of the same class (a CPU check of the script itself; its times say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from models.reference_vae import ReferenceVAE, reference_architecture, tiny_reference_vae_config, vae_class
from scripts.results import emit_result
from training.base.fast_exit import exit_now
from training.config.load import load_config


def timed_encode(reference: ReferenceVAE, video: torch.Tensor, warmup: int, repeats: int) -> float:
    def synchronize():
        if video.device.type == "cuda":
            torch.cuda.synchronize(video.device)

    times = []
    for i in range(warmup + repeats):
        synchronize()
        start = time.perf_counter()
        reference.encode(video, check=False)
        synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--tiny", action="store_true", help="the class's tiny test config (checks the script on a CPU)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    config = load_config(args.profile, args.overrides, check_paths=False)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" and config.mixed_precision == "bf16" else torch.float32
    torch.backends.cudnn.benchmark = config.cudnn_benchmark
    family = config.reference_family
    torch.manual_seed(0)
    vae = vae_class(family)(**tiny_reference_vae_config(family)) if args.tiny else reference_architecture(family)
    reference = ReferenceVAE(vae.to(device, dtype), family, sample_latents=False)
    video = torch.rand(config.batch_size_per_gpu, config.n_frames, 3, config.height, config.width, device=device)
    seconds = {"default": timed_encode(reference, video, args.warmup, args.repeats)}
    reference.set_channels_last()
    seconds["channels_last_3d"] = timed_encode(reference, video, args.warmup, args.repeats)
    faster = min(seconds, key=seconds.get)
    result = {
        "family": family, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."), "tiny": args.tiny,
        "shape": [config.batch_size_per_gpu, config.n_frames, 3, config.height, config.width],
        "encode_s": {name: round(value, 4) for name, value in seconds.items()},
        "channels_last_speedup": round(seconds["default"] / seconds["channels_last_3d"], 3),
        "use": f"ref_vae_channels_last={str(faster == 'channels_last_3d').lower()}",
    }
    emit_result(result, args.json)
    return 0


if __name__ == "__main__":
    exit_now(main())
