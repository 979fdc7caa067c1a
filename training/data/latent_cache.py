"""Reference latents computed once (scripts/cache_latents.py) and read back during training, so the
GPUs train the student instead of running the teacher.

Layout of a cache folder:
  cache.json                      settings it was written with, the splits and their sizes
  train/shard-000000.pt ...       `shard_size` samples each, written whole (temporary file + rename)
  validation/shard-000000.pt ...

A shard holds, per sample: the latent distribution's `mean` and, when the run samples latents,
its `logvar` (both N,t,C,h,w, bf16 by default), and the recipe that produced the clip: `clip`
(path relative to data_root), `sources` (stream frame index of each output frame), `crop`
(top, left after the cover resize) and `flip`. Training decodes the frames again from the
recipe (a few MB of latents per thousand clips instead of GB of frames) and, when
ref_vae_sample_latents is true, draws latents = mean + exp(logvar / 2) * noise with noise seeded
by (seed, epoch, sample), so every epoch sees a fresh sample as on the fly.

Train samples are the on-the-fly draws (epoch e, clip i) for e < epochs: each epoch of the cache
has other windows, crops and flips of every clip. Validation samples are the centred clips.
"""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import torch
from torch.utils.data import Dataset

from training.base.files import unique_temporary
from training.base.latent_format import CacheError, read_metadata
from training.data.clips import DataFailureError, describe_skips
from training.data.decode import ClipError, read_frames, resize_and_crop

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def shard_path(folder: Path, split: str, shard: int) -> Path:
    return Path(folder) / split / f"shard-{shard:06d}.pt"


def write_shard(path: Path, shard: dict) -> None:
    """Whole or not at all: a killed writer leaves a temporary file that is never read."""
    temporary = unique_temporary(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(shard, temporary)
        temporary.replace(path)
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as RuntimeError
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise CacheError(f"cannot write {path} ({error}): free space or fix the folder, then re-run the same "
                         "command (it continues with the missing shards)") from None


class CachedClipDataset(Dataset):
    """dataset[(epoch, index)] -> the VideoClipDataset item for cached sample `index` plus its
    "latents" (fp32 N... t,C,h,w). A clip that no longer decodes is replaced by another cached
    sample and reported in "skipped", as the video dataset does."""

    def __init__(self, folder: Path, split: str, data_root: Path, sample_latents: bool, seed: int, max_redraws: int = 16):
        self.folder, self.split, self.data_root = Path(folder), split, Path(data_root)
        meta = read_metadata(folder)
        self.settings, self.shard_size = meta["settings"], meta["shard_size"]
        self.size = meta["splits"][split]["samples"]
        if self.size == 0:
            raise DataFailureError(f"latent cache {folder} has no {split} samples: re-write it with more clips")
        self.sample_latents, self.seed, self.max_redraws = sample_latents, seed, max_redraws
        self._shards: dict[int, dict] = {}  # memory-mapped, per process (each loader worker opens its own)

    def __len__(self) -> int:
        return self.size

    def _shard(self, shard: int) -> dict:
        if shard not in self._shards:
            self._shards[shard] = torch.load(shard_path(self.folder, self.split, shard), mmap=True, weights_only=True)
        return self._shards[shard]

    def record(self, index: int) -> dict:
        shard = self._shard(index // self.shard_size)
        row = index % self.shard_size
        record = {key: shard[key][row] for key in ("mean", "sources", "crop", "flip")}
        record["logvar"] = shard["logvar"][row] if "logvar" in shard else None
        record["clip"] = shard["clip"][row]
        return record

    def latents(self, record: dict, rng: random.Random) -> torch.Tensor:
        """fp32 latents of a record: the mean, or a sample of the stored distribution."""
        latents = record["mean"].float()
        if self.sample_latents:
            noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(rng.getrandbits(63)))
            latents = latents + (0.5 * record["logvar"].float()).exp() * noise
        return latents

    def __getitem__(self, key) -> dict:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        rng = random.Random(f"cache/{self.seed}/{epoch}/{index}")
        skipped = []
        for attempt in range(self.max_redraws):
            i = index if attempt == 0 else rng.randrange(self.size)
            record = self.record(i)
            path = self.data_root / record["clip"]
            try:
                frames, decoded = read_frames(path, record["sources"].tolist(), cover=(self.settings["height"], self.settings["width"]))
            except ClipError as error:
                skipped.append((error.reason, str(path)))
                continue
            video, _ = resize_and_crop(torch.from_numpy(frames).permute(0, 3, 1, 2), self.settings["height"],
                                       self.settings["width"], None, origin=tuple(record["crop"].tolist()))
            if record["flip"]:
                video = video.flip(-1)
            latents = self.latents(record, rng)
            return {"video": video.contiguous(), "latents": latents, "skipped": skipped, "decoded_frames": decoded}
        raise DataFailureError(f"all {self.max_redraws} draws for cached sample {index} failed: {describe_skips(skipped)}")
