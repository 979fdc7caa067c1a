"""What a latent cache pass costs against the teacher on the fly over the planned steps, for the dry run.

The teacher's cost per clip is the "reference" part of step_costs (the reference VAE's encode of
one micro-step, counted on the meta device in the training dtype) over the clips of a micro-step.
On the fly it runs once per clip drawn: max_steps x global_batch_size clips. A cache pass runs it
once per cached clip: epochs x training clips (scripts/cache_latents.py --epochs), read from the
cache named by latent_cache, else counted in a local data_root or index_path (a remote one is not
listed here: the lines then give the break-even). Both in FLOPs and as GPU time at the roofline
floor (training/plan/roofline.py); measured H100 figures are in docs/performance.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from training.plan.roofline import H100, DeviceSpec, floor_s, shown


def teacher_per_clip(config) -> dict[str, float]:
    """{"flops", "bytes"} of the reference VAE's encode of one clip at the config's shape."""
    from training.plan.step_flops import step_costs

    reference = step_costs(dataclasses.replace(config, latent_cache=""))["reference"]
    clips = config.batch_size_per_gpu
    return {"flops": reference["flops"] / clips, "bytes": reference["bytes"] / clips}


def cached_clips(config) -> tuple[int, int, str] | None:
    """(epochs, training clips, where from) of a cache pass: the cache latent_cache names, else one
    epoch of the clips a local data_root / index_path lists; None where neither can be read here."""
    from training.base.latent_format import CacheError, read_metadata

    if config.latent_cache:
        try:
            meta = read_metadata(Path(config.latent_cache))
        except (CacheError, OSError, ValueError):
            return None
        samples, epochs = meta["splits"]["train"]["samples"], meta["epochs"]
        return epochs, samples // max(epochs, 1), f"the cache {config.latent_cache}"
    from training.base.storage import is_remote
    from training.data.index import IndexFormatError, read_index

    source = config.index_path or config.data_root
    if is_remote(source) or not Path(source).exists():
        return None
    try:
        index = read_index(source, config.data_root if config.index_path else None)
        train, _ = index.split(config.validation_fraction, config.validation_sources)
    except (IndexFormatError, OSError):
        return None
    return 1, len(train), f"{source}, --epochs 1"


def cache_cost_lines(config, spec: DeviceSpec = H100) -> list[str]:
    """The dry run's lines: the teacher over the planned steps on the fly, against a cache pass."""
    if not config.use_ref_vae:
        return []
    per_clip = teacher_per_clip(config)
    per_clip_floor = floor_s(per_clip["flops"], per_clip["bytes"], spec)
    drawn = config.max_steps * config.global_batch_size

    def cost(clips: int) -> str:
        return f"{shown(clips * per_clip['flops'] / 1e15)} PFLOP, {shown(clips * per_clip_floor / 3600)} GPU-h at the floor"

    lines = [f"teacher: {per_clip['flops'] / 1e12:.2f} TFLOP and {per_clip['bytes'] / 1e9:.1f} GB per clip "
             f"(floor {per_clip_floor * 1e3:.1f} ms on {spec.name}); on the fly over max_steps={config.max_steps} x "
             f"{config.global_batch_size} clips = {drawn:,} encodes: {cost(drawn)}"]
    found = cached_clips(config)
    if found is None:
        lines.append(f"a cache pass: epochs x training clips encodes (scripts/cache_latents.py --epochs); it costs less "
                     f"than on the fly while that is under {drawn:,}")
        return lines
    epochs, clips, source = found
    encodes = epochs * clips
    lines.append(f"a cache pass of {epochs} x {clips:,} clips ({source}) = {encodes:,} encodes: {cost(encodes)} "
                 f"({encodes / drawn:.3g}x on the fly); training reads each cached sample (crop, frame offsets and flip "
                 f"fixed) {drawn / max(encodes, 1):,.1f} times")
    return lines
