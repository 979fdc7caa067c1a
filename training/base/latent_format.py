"""The latent cache's metadata (metadata.json): its format version, splits, and whether a cache fits a
run's config."""

from __future__ import annotations

import json
from pathlib import Path


FORMAT_VERSION = 1


SPLITS = ("train", "validation")


# settings a cache must share with the run that reads it (the run's value, the cache's value)
MATCHING_KEYS = ("ref_vae_family", "ref_vae_path", "height", "width", "n_frames")


class CacheError(ValueError):
    """A cache that cannot serve this run; the message names the folder, the setting and the fix."""


def read_metadata(folder: Path) -> dict:
    path = Path(folder) / "cache.json"
    if not path.is_file():
        raise CacheError(f"latent_cache={str(folder)!r} has no cache.json: write it with python -m scripts.cache_latents "
                         "(or set latent_cache='' to encode on the fly)")
    return json.loads(path.read_text())


def check_compatible(folder: Path, config, space: str) -> dict:
    """The cache's metadata, after checking it was written for this run's reference VAE and clips,
    in the latent space the run learns (`space`: training/config/views.py latent_space)."""
    meta = read_metadata(folder)
    if not meta.get("complete"):
        raise CacheError(f"latent_cache={str(folder)!r} is incomplete: re-run the same scripts.cache_latents command, "
                         "it continues where it stopped")
    for key in MATCHING_KEYS:
        if meta["settings"][key] != getattr(config, key):
            raise CacheError(f"latent_cache={str(folder)!r} was written with {key}={meta['settings'][key]!r} but this run "
                             f"has {key}={getattr(config, key)!r}: use a cache written for this config or fix {key}")
    cached_space = meta["settings"].get("ref_vae_latent_space", "raw")  # caches before the key held raw latents
    if cached_space != space:
        raise CacheError(f"latent_cache={str(folder)!r} holds {cached_space} latents but this run learns "
                         f"ref_vae_latent_space={space} ({config.ref_vae_latent_space}): re-write the cache "
                         f"for this config, or set ref_vae_latent_space={cached_space}")
    if config.ref_vae_sample_latents and not meta["stores_logvar"]:
        raise CacheError(f"latent_cache={str(folder)!r} holds means only, but ref_vae_sample_latents=true: set it to false "
                         "or re-write the cache with --store logvar")
    return meta
