"""Aspect and size buckets (`buckets` in the config): each training clip goes to the (height, width)
bucket nearest its own aspect ratio, and every micro-step takes its clips, on every rank, from one
bucket. The sampler keeps the contract of EpochShardSampler: a function of (seed, epoch), disjoint
per rank, `set_position(epoch, batch)` for an exact resume. docs/data.md#aspect-buckets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Sampler

from training.config.views import largest_bucket
from training.data.index import ClipIndex, DataFailureError


def displayed_aspects(index: ClipIndex) -> np.ndarray:
    """Width / height of each clip as shown (a quarter-turn rotation swaps the stored sides); NaN
    where the index has no size."""
    width, height = index.width.astype(np.float64), index.height.astype(np.float64)
    quarter_turn = np.round(index.rotation.astype(np.float64) / 90).astype(np.int64) % 2 == 1
    shown_w, shown_h = np.where(quarter_turn, height, width), np.where(quarter_turn, width, height)
    known = (shown_w > 0) & (shown_h > 0)
    return np.where(known, shown_w / np.where(known, shown_h, 1), np.nan)


def nearest_bucket(aspects: np.ndarray, buckets) -> np.ndarray:
    """Index of the bucket whose aspect ratio is nearest each aspect, on a log scale (16:9 is as far
    from 1:1 as 9:16); ties go to the bucket listed first."""
    logs = np.log(np.array([w / h for h, w in buckets], dtype=np.float64))
    return np.abs(np.log(aspects)[:, None] - logs[None, :]).argmin(axis=1)


def assign_buckets(index: ClipIndex, buckets, default_shape: tuple[int, int]) -> np.ndarray:
    """The bucket (an index into `buckets`) of every clip. A clip whose index entry has no width or
    height goes to the bucket nearest default_shape's aspect (height x width: where a run without
    buckets would crop it), since knowing its size would mean opening every file."""
    aspects = displayed_aspects(index)
    aspects[np.isnan(aspects)] = default_shape[1] / default_shape[0]
    return nearest_bucket(aspects, buckets).astype(np.int16)


def cudnn_autotuning(config) -> bool:
    """Whether cuDNN autotunes (torch.backends.cudnn.benchmark): cudnn_benchmark where the run's
    shapes are fixed. Under buckets each bucket is a new shape, met at random through the first
    epoch, and each would be timed again mid-run: a time spike and a workspace peak after the first
    log interval, which the memory plan takes to hold all tuning. docs/performance.md#cudnn-autotuning."""
    return bool(config.cudnn_benchmark and not config.buckets)


class BucketBatchSampler(Sampler):
    """Yields (epoch, index) for this rank. Each epoch permutes the clips by (seed, epoch) as
    EpochShardSampler does, cuts each bucket's clips, in that order, into groups of batch_size x
    world_size (a bucket's last partial group waits for a later epoch's permutation), and shuffles
    the groups with the same generator. Micro-step k takes group k: every rank the same bucket
    (the same shapes in Seraena's all-reduced step, no rank waiting on a larger one), rank r its
    r-th batch_size clips. `set_position(epoch, batch)` starts mid-epoch, for an exact resume."""

    def __init__(self, bucket_ids, batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shapes=None):
        self.bucket_ids = torch.as_tensor(np.asarray(bucket_ids, dtype=np.int64))
        self.size, self.batch_size, self.rank, self.world_size, self.seed = len(self.bucket_ids), batch_size, rank, world_size, seed
        self.group = batch_size * world_size
        counts = torch.bincount(self.bucket_ids, minlength=len(shapes or ())).tolist()
        self.groups_per_bucket = [count // self.group for count in counts]
        self.batches_per_epoch = sum(self.groups_per_bucket)
        if self.batches_per_epoch == 0:
            names = [f"{h}x{w}" for h, w in shapes] if shapes else [str(i) for i in range(len(counts))]
            held = ", ".join(f"{name} {count}" for name, count in zip(names, counts))
            raise DataFailureError(f"no bucket holds the {self.group} training clips one micro-step takes (batch_size_per_gpu "
                                   f"{batch_size} x {world_size} processes; clips per bucket: {held}): add clips, use fewer "
                                   "buckets or lower batch_size_per_gpu")
        self.epoch, self.start_batch = 0, 0

    def set_position(self, epoch: int, batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, batch

    def epoch_groups(self, epoch: int) -> torch.Tensor:
        """(batches_per_epoch, batch_size x world_size) clip indices: row k is micro-step k, one bucket."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        order = torch.randperm(self.size, generator=generator)
        in_order = self.bucket_ids[order]
        rows = [order[in_order == bucket][: count * self.group].view(count, self.group)
                for bucket, count in enumerate(self.groups_per_bucket) if count]
        groups = torch.cat(rows)
        return groups[torch.randperm(len(groups), generator=generator)]

    def __iter__(self):
        mine = self.epoch_groups(self.epoch)[self.start_batch :, self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        for index in mine.reshape(-1).tolist():
            yield (self.epoch, index)

    def __len__(self) -> int:
        return (self.batches_per_epoch - self.start_batch) * self.batch_size


def planning_index(config) -> tuple[ClipIndex | None, str]:
    """The run's clip index when the dry run can read it cheaply (a local index file, or a local
    prepared folder's index.jsonl), else (None, why not)."""
    from training.base.storage import is_remote
    from training.data.index import IndexFormatError, is_prepared_dataset, read_index

    source = config.index_path or config.data_root
    if is_remote(source):
        return None, f"{source} is in object storage (the run reads it at its start)"
    try:
        if config.index_path:
            return (read_index(config.index_path, config.data_root), "") if Path(config.index_path).is_file() else (
                None, f"index_path={config.index_path} does not exist yet")
        if Path(config.data_root).is_dir() and is_prepared_dataset(config.data_root):
            return read_index(config.data_root), ""
    except IndexFormatError as error:
        return None, str(error)
    if config.sample_data and not Path(config.data_root).is_dir():
        return None, f"data_root={config.data_root} is made at the first run (sample_data={config.sample_data})"
    return None, f"data_root={config.data_root} is listed without clip sizes: {sizes_fix(config.data_root)}"


def sizes_fix(data_root) -> str:
    """How to give a run the clip sizes buckets need: an index with width and height."""
    beside = Path(str(data_root)) / "index.jsonl"
    if beside.is_file():
        return f"set index_path={beside} (the folder's own index, with the sizes)"
    return "set index_path to an index with width and height (python -m scripts.build_index DATA_ROOT --out INDEX)"


def require_sizes(index: ClipIndex, buckets) -> None:
    """Buckets sort clips by their sizes: an index with none (a folder listing) would put every clip
    in one bucket, so that is refused in one line (a few clips without sizes are not; see assign_buckets)."""
    if len(index) and np.isnan(displayed_aspects(index)).all():
        shapes = ", ".join(f"{h}x{w}" for h, w in buckets)
        raise DataFailureError(f"buckets {shapes} need each clip's width and height, and the index of {index.root} has none "
                               f"(a folder listing): {sizes_fix(index.root)}")


def bucket_lines(config) -> list[str]:
    """The dry run's bucket listing: each bucket with its share of the training clips when the index
    is readable here, the largest (the memory estimate's shape), and where validation runs."""
    if not config.buckets:
        return []
    index, why = planning_index(config)
    counts, train = None, None
    if index is not None:
        train, _ = index.split(config.validation_fraction, config.validation_sources)
        counts = np.bincount(assign_buckets(train, config.buckets, (config.height, config.width)), minlength=len(config.buckets))
    largest, group = largest_bucket(config.buckets), config.batch_size_per_gpu * config.num_processes
    lines = []
    for number, (height, width) in enumerate(config.buckets):
        line = f"{height}x{width} ({height * width:,} px, aspect {width / height:.2f})"
        if counts is not None:
            share = counts[number] / max(1, len(train))
            line += (f": {counts[number]} of {len(train)} training clips ({share:.0%}), "
                     f"{counts[number] // group} micro-steps per epoch")
        lines.append(line + ("; the memory estimate's shape" if (height, width) == largest else ""))
    if counts is None:
        lines.append(f"shares of clips not known here: {why}")
    else:
        unknown = int(np.isnan(displayed_aspects(train)).sum())
        if unknown:
            lines.append(f"{unknown} clips have no width/height in the index: they go to the bucket nearest height x width "
                         f"({config.height}x{config.width}); scripts/build_index.py writes the sizes")
    lines.append(f"validation clips: at height x width ({config.height}x{config.width}), as without buckets")
    if config.cudnn_benchmark:
        lines.append("cuDNN autotuning (cudnn_benchmark): off, each bucket's shape would be tuned again mid-run")
    return lines
