"""The training dataset and its sampler: clip draws per (seed, epoch, index), broken files replaced and
counted, batches in shared memory, the resumable sharded sampler."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from training.data.buckets import assign_buckets, require_sizes
from training.data.shared_memory import SharedMemoryFull
from training.data.decode import ClipError, read_clip, resize_and_crop, zoomed_crop
from training.data.index import ClipIndex, DataFailureError

SKIP_REASONS = ("open_error", "no_video_stream", "decode_error", "too_short", "no_frames")


@dataclass
class ClipSpec:
    n_frames: int
    height: int
    width: int
    min_frame_delta: int = 1
    max_frame_delta: int = 1
    horizontal_flip: bool = False
    loop_short_clips: bool = False
    decode_threads: int = 2
    crop_min_side: int = 0  # scale augmentation of training clips (0 = off; see zoomed_cover)
    buckets: tuple = ()  # (height, width) pairs for training clips (training/data/buckets.py); () = height x width


class VideoClipDataset(Dataset):
    """dataset[(epoch, index)] -> {"video": uint8 T,3,H,W, "skipped": [(reason, path), ...],
    "decoded_frames": frames the decoder produced for it, "recipe": how to read the same clip
    again (clip: relative path, sources: stream frame indices, crop: (top, left), flip)}.
    Training draws (start, stride, crop, flip) from a generator seeded by (seed, epoch, index);
    validation takes a centred crop at the smallest stride from a fixed start. With spec.buckets a
    training sample is cut to the bucket of the clip its key names (`bucket_ids`), a replacement
    draw included, so a batch of one bucket stays one shape; validation stays at height x width."""

    def __init__(self, index: ClipIndex, spec: ClipSpec, train: bool = True, seed: int = 0, max_redraws: int = 16):
        if len(index) == 0:
            raise DataFailureError(f"no video files under {index.root}: check data_root / index_path")
        self.index, self.spec, self.train, self.seed, self.max_redraws = index, spec, train, seed, max_redraws
        self.bucket_ids = None
        if train and spec.buckets:
            require_sizes(index, spec.buckets)
            self.bucket_ids = assign_buckets(index, spec.buckets, (spec.height, spec.width))

    def __len__(self) -> int:
        return len(self.index)

    def at_size(self, height: int, width: int) -> "VideoClipDataset":
        """The same clips cut to height x width (validation_sizes)."""
        spec = dataclasses.replace(self.spec, height=height, width=width, buckets=())
        return VideoClipDataset(self.index, spec, train=self.train, seed=self.seed, max_redraws=self.max_redraws)

    def __getitem__(self, key) -> dict:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        rng = random.Random(f"{self.seed}/{epoch}/{index}")
        spec, skipped, decoded = self.spec, [], 0
        height, width = spec.buckets[self.bucket_ids[index]] if self.bucket_ids is not None else (spec.height, spec.width)
        for attempt in range(self.max_redraws):
            i = index if attempt == 0 else rng.randrange(len(self.index))
            max_delta = spec.max_frame_delta if self.train else spec.min_frame_delta
            window_rng = rng if self.train else random.Random(i)
            zoom = (rng.random(), spec.crop_min_side) if self.train and spec.crop_min_side else None  # the same for every frame
            try:
                with self.index.local_copy(i) as path:
                    frames, decoded, sources = read_clip(path, int(self.index.frames[i]), spec.n_frames, spec.min_frame_delta,
                                                         max_delta, window_rng, spec.loop_short_clips,
                                                         cover=None if zoom else (height, width),  # zoom: own size
                                                         threads=spec.decode_threads)
            except ClipError as error:
                skipped.append((error.reason, self.index.location(i)))
                continue
            video = torch.from_numpy(frames).permute(0, 3, 1, 2)
            video, crop = (zoomed_crop(video, height, width, *zoom, rng) if zoom
                           else resize_and_crop(video, height, width, rng if self.train else None))
            flip = self.train and spec.horizontal_flip and rng.random() < 0.5
            recipe = {"clip": self.index.relative(i), "sources": sources, "crop": crop, "flip": flip}
            return {"video": (video.flip(-1) if flip else video).contiguous(), "skipped": skipped,
                    "decoded_frames": decoded, "recipe": recipe}
        raise DataFailureError(f"all {self.max_redraws} draws for sample {index} failed: {describe_skips(skipped)}")


def stack_in_shared_memory(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack; in a loader worker, straight into shared memory. torch would otherwise copy the
    batch there while pickling it in the worker queue's feeder thread, where a full /dev/shm only
    prints a traceback and the rank waits for that batch forever. Here the failure is raised in the
    worker's fetch and reaches the rank with the batch (SharedMemoryFull, training/loop/recovery.py)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.stack(tensors)
    out = torch.empty((len(tensors), *tensors[0].shape), dtype=tensors[0].dtype)
    try:
        out.share_memory_()
    except RuntimeError as error:  # "unable to allocate shared memory(shm) for file </torch_...>: No space left on device"
        if "shared memory" not in str(error):
            raise
        reason = str(error).rsplit(": ", 1)[-1].split(" (")[0]  # "No space left on device"
        raise SharedMemoryFull(f"a data worker could not put its {out.nbytes / 1e6:.1f} MB batch in shared memory "
                               f"({reason})") from None
    return torch.stack(tensors, out=out)


def collate_clips(items: list[dict]) -> dict:
    batch = {"video": stack_in_shared_memory([item["video"] for item in items]),
             "skipped": [s for item in items for s in item["skipped"]],
             "decoded_frames": sum(item["decoded_frames"] for item in items)}
    if "latents" in items[0]:  # from a latent cache (training/data/latent_cache.py)
        batch["latents"] = stack_in_shared_memory([item["latents"] for item in items])
    return batch


def describe_skips(skipped: list[tuple[str, str]], examples: int = 3) -> str:
    by_reason: dict[str, list[str]] = {}
    for reason, path in skipped:
        by_reason.setdefault(reason, []).append(path)
    return "; ".join(f"{reason} x{len(paths)} (e.g. {', '.join(sorted(set(paths))[:examples])})" for reason, paths in by_reason.items())


class FailureTracker:
    """Counts skipped draws by reason; `problem()` says, in one line, when their share exceeds the
    limit (judged after `min_draws`, so one early broken file does not stop a run). It never
    raises by itself: the ranks agree on stopping (training/base/agreement.py), so one rank's broken
    clips stop every rank together, with the same message."""

    def __init__(self, max_fraction: float, min_draws: int = 50):
        self.max_fraction, self.min_draws = max_fraction, min_draws
        self.counts: Counter = Counter()
        self.examples: list[tuple[str, str]] = []
        self.draws = 0

    def update(self, skipped: list[tuple[str, str]], samples: int) -> None:
        self.draws += samples + len(skipped)
        self.counts.update(reason for reason, _ in skipped)
        self.examples.extend(skipped[: max(0, 20 - len(self.examples))])

    def problem(self) -> str:
        failures = sum(self.counts.values())
        if self.draws < self.min_draws or failures <= self.max_fraction * self.draws:
            return ""
        return (f"{failures} of {self.draws} clip draws failed ({failures / self.draws:.1%} > max_failed_fraction "
                f"{self.max_fraction:.1%}): {describe_skips(self.examples)}. Fix or remove those files, or raise max_failed_fraction")


class EpochShardSampler(Sampler):
    """Yields (epoch, index) for this rank: a permutation seeded by (seed, epoch), cut to a whole
    number of batches on every rank, ranks taking disjoint interleaved slices.
    `set_position(epoch, batch)` starts mid-epoch, for an exact resume."""

    def __init__(self, size: int, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True):
        self.size, self.batch_size, self.rank, self.world_size = size, batch_size, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.batches_per_epoch = size // world_size // batch_size
        if self.batches_per_epoch == 0:
            raise DataFailureError(
                f"{size} training clips cannot fill one batch of {batch_size} on each of {world_size} processes: "
                "add clips or lower batch_size_per_gpu"
            )
        self.epoch, self.start_batch = 0, 0

    def set_position(self, epoch: int, batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, batch

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100_003 + self.epoch))
        else:
            order = torch.arange(self.size)
        mine = order[self.rank :: self.world_size][: self.batches_per_epoch * self.batch_size]
        for index in mine[self.start_batch * self.batch_size :].tolist():
            yield (self.epoch, index)

    def __len__(self) -> int:
        return (self.batches_per_epoch - self.start_batch) * self.batch_size


def seed_worker(worker_id: int) -> None:
    """Library RNGs in workers derived from torch's per-worker seed (samples do not use them)."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
