"""Run the reference VAE once over a dataset and store its latents (training/data/latent_cache.py), so
training reads them instead of running the teacher every step.

    accelerate launch --num_processes 8 -m scripts.cache_latents h100 --out /data/cache [--epochs 4]
    python -m scripts.cache_latents cpu --out cache --set data_root=data/videos   # one process

It takes the same profile and --set overrides as training and writes the clips training would
draw: epochs x (training clips), plus the first validation_samples held-out clips. Shards are
spread over the processes; a shard is written whole or not at all, so the same command after a
crash or preemption (on any number of processes) continues with the missing shards. Then train
with --set latent_cache=/data/cache.

Clips of one shape (a cache has one crop size) are stacked --batch-size at a time into each
reference VAE call; the VAE is loaded as training loads it (bf16 on a GPU; fp32 on a CPU, which has
no fast bf16 convolutions). Each process prints its clips/s (whole pass, and the encode alone),
and cache.json records the pass's ("encode_pass").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from training.base.fast_exit import exit_now
from training.base.files import unique_temporary
from training.base.latent_format import FORMAT_VERSION, SPLITS, CacheError
from training.config.load import load_config
from training.config.schema import ConfigError
from training.config.views import latent_space, measured_geometry
from training.data.clips import DataFailureError, collate_clips
from training.data.index import IndexFormatError
from training.data.latent_cache import DTYPES, shard_path, write_shard

SETTINGS = ("ref_vae_family", "ref_vae_path", "height", "width", "n_frames", "min_frame_delta", "max_frame_delta",
            "horizontal_flip", "short_clip_policy", "seed", "data_root", "index_path", "validation_fraction",
            "validation_sources")
OLD_DEFAULTS = {"ref_vae_latent_space": "raw", "validation_sources": ""}  # settings a cache written before them holds implicitly


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m scripts.cache_latents", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="training profile name or .py config file")
    parser.add_argument("--out", type=Path, required=True, help="cache folder (created; an existing one is continued)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--epochs", type=int, default=1, help="draws (window, crop, flip) of every training clip")
    parser.add_argument("--shard-size", type=int, default=256, help="samples per shard file")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="clips stacked into each reference VAE call (0 = batch_size_per_gpu; no gradients are kept, "
                             "so a GPU takes several times the training batch)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="storage precision of the latents")
    parser.add_argument("--store", choices=("logvar", "mean"), default="logvar",
                        help="logvar: mean and log-variance (training can sample); mean: half the size, mean only")
    return parser.parse_args(argv)


def cache_metadata(config, args, sizes: dict[str, int]) -> dict:
    return {
        "format": FORMAT_VERSION, "complete": False, "shard_size": args.shard_size, "epochs": args.epochs,
        "dtype": args.dtype, "stores_logvar": args.store == "logvar",
        "settings": {**{key: getattr(config, key) for key in SETTINGS}, "ref_vae_latent_space": latent_space(config)},
        "splits": {split: {"samples": n, "shards": -(-n // args.shard_size)} for split, n in sizes.items()},
    }


def check_same_settings(out: Path, meta: dict) -> None:
    """An existing cache is continued only when it was started with the same settings."""
    path = out / "cache.json"
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    for key in ("shard_size", "epochs", "dtype", "stores_logvar", "splits"):
        if old[key] != meta[key]:
            raise CacheError(f"{out} holds a cache written with {key}={old[key]!r}, this command gives {meta[key]!r}: "
                             "use another --out folder or the same options")
    for key, value in meta["settings"].items():
        if old["settings"].get(key, OLD_DEFAULTS.get(key)) != value:
            raise CacheError(f"{out} holds a cache written with {key}={old['settings'].get(key)!r}, this config has "
                             f"{value!r}: use another --out folder or the same config")


def encode_shard(dataset, keys: list, reference, batch_size: int, num_workers: int, dtype,
                 store_logvar: bool) -> tuple[dict, float]:
    """The shard of `keys`, encoded batch_size clips per reference VAE call, and the seconds spent in
    those calls (the copy of the latents back to the CPU waits for the device's work)."""
    from torch.utils.data import DataLoader

    def collate(items):
        return {**collate_clips(items), "recipes": [item["recipe"] for item in items]}

    device = reference.vae.device
    loader = DataLoader(_Keyed(dataset, keys), batch_size=batch_size, num_workers=num_workers, collate_fn=collate,
                        pin_memory=device.type == "cuda")
    parts = {"mean": [], "logvar": [], "sources": [], "crop": [], "flip": [], "clip": [], "skipped": []}
    encode_s = 0.0
    for batch in loader:
        started = time.perf_counter()
        video = batch["video"].to(device, non_blocking=True).float() / 255  # uint8 over the bus, scaled on the device
        mean, logvar = reference.encode_distribution(video)
        parts["mean"].append(mean.to(dtype).cpu())
        if store_logvar:
            parts["logvar"].append(logvar.to(dtype).cpu())
        encode_s += time.perf_counter() - started
        parts["sources"] += [r["sources"] for r in batch["recipes"]]
        parts["crop"] += [list(r["crop"]) for r in batch["recipes"]]
        parts["flip"] += [r["flip"] for r in batch["recipes"]]
        parts["clip"] += [r["clip"] for r in batch["recipes"]]
        parts["skipped"] += [list(s) for s in batch["skipped"]]
    shard = {"mean": torch.cat(parts["mean"]), "sources": torch.tensor(parts["sources"], dtype=torch.int32),
             "crop": torch.tensor(parts["crop"], dtype=torch.int32), "flip": torch.tensor(parts["flip"]),
             "clip": parts["clip"], "skipped": parts["skipped"]}
    if store_logvar:
        shard["logvar"] = torch.cat(parts["logvar"])
    return shard, encode_s


class _Keyed(torch.utils.data.Dataset):
    """The dataset items for a fixed list of (epoch, index) keys."""

    def __init__(self, dataset, keys):
        self.dataset, self.keys = dataset, keys

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        return self.dataset[self.keys[i]]


def split_keys(split: str, dataset, epochs: int, validation_samples: int) -> list[tuple[int, int]]:
    if split == "train":
        return [(epoch, index) for epoch in range(epochs) for index in range(len(dataset))]
    return [(0, index) for index in range(min(validation_samples, len(dataset)))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.config, args.overrides, num_processes=int(os.environ.get("WORLD_SIZE", "1")))
        if not config.use_ref_vae:
            raise ConfigError("use_ref_vae=false: autoencoder mode has no reference latents to cache")
        if config.crop_min_side:
            raise ConfigError(f"crop_min_side={config.crop_min_side}: a cache stores one crop per clip; cache with crop_min_side=0")
        from training.loop.build import build_datasets

        datasets = dict(zip(SPLITS, build_datasets(config)))
    except (ConfigError, CacheError, DataFailureError, IndexFormatError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    keys = {split: split_keys(split, datasets[split], args.epochs, config.validation_samples) for split in SPLITS}
    meta = cache_metadata(config, args, {split: len(k) for split, k in keys.items()})
    try:
        check_same_settings(args.out, meta)
    except CacheError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    from accelerate import Accelerator

    from models.reference_vae import load_reference_vae

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, world = accelerator.process_index, accelerator.num_processes
    if accelerator.is_main_process:
        args.out.mkdir(parents=True, exist_ok=True)
        if not (args.out / "cache.json").is_file():
            (args.out / "cache.json").write_text(json.dumps(meta, indent=2) + "\n")
    reference = load_reference_vae(config.reference_family, config.ref_vae_path, accelerator.device, tiling=config.ref_vae_tiling,
                                   latent_space=config.ref_vae_latent_space, geometry=measured_geometry(config),
                                   xformers=config.ref_vae_xformers, channels_last=config.ref_vae_channels_last)
    batch_size = args.batch_size or config.batch_size_per_gpu
    print(f"rank {rank}: {config.reference_family} reference VAE in {str(reference.dtype).removeprefix('torch.')} on "
          f"{accelerator.device}, {batch_size} clips per encode", flush=True)
    started, written, reused, clips, encode_s, failed = time.perf_counter(), 0, 0, 0, 0.0, False
    for split in SPLITS:
        if failed:
            break
        shards = meta["splits"][split]["shards"]
        for shard in range(rank, shards, world):  # round robin: any world size continues any cache
            path = shard_path(args.out, split, shard)
            if path.is_file():
                reused += 1
                continue
            shard_keys = keys[split][shard * args.shard_size : (shard + 1) * args.shard_size]
            try:
                shard_data, seconds = encode_shard(datasets[split], shard_keys, reference, batch_size, config.num_workers,
                                                   DTYPES[args.dtype], meta["stores_logvar"])
                write_shard(path, shard_data)
            except (CacheError, DataFailureError) as error:
                # this rank stops encoding but meets the others in the gather below (returning here had
                # torchrun end them mid-shard); every shard written stays, for the same command to continue
                print(f"error on rank {rank}: {error}", file=sys.stderr, flush=True)
                failed = True
                break
            written, clips, encode_s = written + 1, clips + len(shard_keys), encode_s + seconds
            print(f"rank {rank}: {split} shard {shard + 1}/{shards} written ({len(shard_keys)} clips, "
                  f"{time.perf_counter() - started:.0f} s)", flush=True)
    wall_s = time.perf_counter() - started
    print(f"rank {rank}: {written} shards written, {reused} already there; {rate_line(clips, wall_s, encode_s)}", flush=True)
    # every rank's (clips, seconds, encode seconds, failed): the pass's rate is all clips over the slowest rank's time
    rows = accelerator.gather(torch.tensor([[clips, wall_s, encode_s, failed]], dtype=torch.float64,
                                           device=accelerator.device)).cpu().tolist()
    accelerator.wait_for_everyone()
    failed_ranks = [r for r, row in enumerate(rows) if row[3]]
    if failed_ranks:
        if accelerator.is_main_process:
            print(f"error: rank {', '.join(map(str, failed_ranks))} stopped on an error (above); the shards "
                  "written are kept: fix the cause and re-run the same command to encode the missing ones only",
                  file=sys.stderr, flush=True)
        accelerator.end_training()
        return 2
    if accelerator.is_main_process:
        finish(args.out, meta, encode_pass([row[:3] for row in rows], batch_size, reference.dtype, accelerator.device))
    accelerator.end_training()
    return 0


def rate_line(clips: int, wall_s: float, encode_s: float) -> str:
    if not clips:
        return "no clips encoded"
    return (f"{clips} clips encoded in {wall_s:.2f} s: {clips / wall_s:.2f} clips/s "
            f"({clips / encode_s:.2f} clips/s in the reference VAE's encode alone)")


def encode_pass(ranks: list[list[float]], batch_size: int, dtype: torch.dtype, device: torch.device) -> dict:
    """What this command encoded, for cache.json: clips, the slowest rank's seconds and clips/s over all
    processes; the encode alone per process (the teacher's rate, data loading left out)."""
    clips, wall_s = sum(r[0] for r in ranks), max(r[1] for r in ranks)
    encode_s = sum(r[2] for r in ranks)
    return {"clips": int(clips), "seconds": wall_s, "processes": len(ranks), "clips_per_s": clips / wall_s if clips else None,
            "encode_clips_per_s_per_process": clips / encode_s if clips else None,
            "batch_size": batch_size, "dtype": str(dtype).removeprefix("torch."), "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}


def finish(out: Path, meta: dict, pass_record: dict | None = None) -> None:
    """Checks every shard is there, counts skipped draws and marks the cache complete; records the
    encode rate of the command that completed it."""
    skipped: dict[str, int] = {}
    for split in SPLITS:
        for shard in range(meta["splits"][split]["shards"]):
            path = shard_path(out, split, shard)
            if not path.is_file():
                raise CacheError(f"{path} is missing after every process finished: re-run the same command")
            for reason, _ in torch.load(path, mmap=True, weights_only=True)["skipped"]:
                skipped[reason] = skipped.get(reason, 0) + 1
    meta = {**meta, "complete": True, "skipped_draws": skipped, **({"encode_pass": pass_record} if pass_record else {})}
    temporary = unique_temporary(out / "cache.json")
    temporary.write_text(json.dumps(meta, indent=2) + "\n")
    temporary.replace(out / "cache.json")
    samples = {split: meta["splits"][split]["samples"] for split in SPLITS}
    print(f"latent cache complete: {out} ({samples['train']} train, {samples['validation']} validation samples; "
          f"skipped draws: {skipped or 'none'}). Train with --set latent_cache={out}", flush=True)
    if pass_record and pass_record["clips"]:
        print(f"this pass: {pass_record['clips']} clips in {pass_record['seconds']:.1f} s on {pass_record['processes']} "
              f"process(es): {pass_record['clips_per_s']:.2f} clips/s", flush=True)


if __name__ == "__main__":
    exit_now(main())
