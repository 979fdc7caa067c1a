"""Video clips for training: find files, split train/validation by a stable hash, decode a clip of
`n_frames` at a random stride, honour rotation, resize to cover H x W, crop, optionally flip.

Output of the dataset: uint8 tensors T,3,H,W. A file that cannot give a clip is replaced by
another draw (bounded, no recursion) and counted by reason in `skipped`.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

VIDEO_EXTENSIONS = {".mp4", ".mkv", ".mov", ".webm", ".avi", ".m4v"}
MAX_REDRAWS = 16


class ClipError(Exception):
    """A file that cannot give the requested clip; `reason` is a short counter key."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def list_videos(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.suffix.lower() in VIDEO_EXTENSIONS and p.is_file())


def is_validation(relative_path: str, fraction: float) -> bool:
    """Stable split: adding files never moves old ones between train and validation."""
    digest = hashlib.sha1(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def split_videos(root: Path, validation_fraction: float) -> tuple[list[Path], list[Path]]:
    train, validation = [], []
    for path in list_videos(root):
        (validation if is_validation(path.relative_to(root).as_posix(), validation_fraction) else train).append(path)
    if not validation and train and validation_fraction > 0:
        validation.append(train.pop())  # tiny folders: keep at least one held-out clip
    return train, validation


def decode_clip(path: Path, n_frames: int, stride: int, rng: random.Random, loop_short: bool) -> np.ndarray:
    """n_frames,H,W,3 uint8 frames at `stride` from a random start, rotation applied."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            span = (n_frames - 1) * stride + 1
            known = stream.frames or 0
            start = rng.randrange(max(known - span, 0) + 1) if known >= span else 0
            wanted = start + span
            frames, rotation = [], 0
            for index, frame in enumerate(container.decode(stream)):
                if index >= start and (index - start) % stride == 0:
                    frames.append(frame.to_ndarray(format="rgb24"))
                    rotation = getattr(frame, "rotation", 0) or 0
                if index + 1 >= wanted:
                    break
    except ClipError:
        raise
    except Exception as error:  # PyAV raises many types for broken containers and streams
        raise ClipError("decode_error", f"{path}: {error}") from error
    if not frames:
        raise ClipError("no_frames", str(path))
    if len(frames) < n_frames:
        if not loop_short:
            raise ClipError("too_short", f"{path}: {len(frames)} of {n_frames} frames at stride {stride}")
        frames = [frames[i % len(frames)] for i in range(n_frames)]
    video = np.stack(frames)
    if rotation:
        video = np.rot90(video, k=round(rotation / 90) % 4, axes=(1, 2))
    return np.ascontiguousarray(video)


def resize_and_crop(video: torch.Tensor, height: int, width: int, rng: random.Random | None) -> torch.Tensor:
    """T,3,h,w uint8 -> T,3,height,width uint8: scale (keeping aspect) to cover, then crop
    (random when rng is given, centred otherwise)."""
    h, w = video.shape[-2:]
    scale = max(height / h, width / w)
    new_h, new_w = max(height, round(h * scale)), max(width, round(w * scale))
    if (new_h, new_w) != (h, w):
        video = F.interpolate(video.float(), size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
        video = video.round().clamp(0, 255).to(torch.uint8)
    top = rng.randrange(new_h - height + 1) if rng else (new_h - height) // 2
    left = rng.randrange(new_w - width + 1) if rng else (new_w - width) // 2
    return video[..., top : top + height, left : left + width]


class VideoClipDataset(Dataset):
    """Item i (with `epoch` set by the loop) is reproducible: the same seed gives the same clip."""

    def __init__(
        self,
        paths: list[Path],
        n_frames: int,
        height: int,
        width: int,
        min_frame_delta: int = 1,
        max_frame_delta: int = 1,
        train: bool = True,
        horizontal_flip: bool = False,
        loop_short_clips: bool = False,
        seed: int = 0,
    ):
        if not paths:
            raise ValueError("no video files to sample from: check data_root / index_path")
        self.paths = list(paths)
        self.n_frames, self.height, self.width = n_frames, height, width
        self.min_frame_delta, self.max_frame_delta = min_frame_delta, max_frame_delta
        self.train, self.horizontal_flip, self.loop_short_clips = train, horizontal_flip, loop_short_clips
        self.seed = seed
        self.epoch = 0
        self.skipped: Counter = Counter()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = random.Random(f"{self.seed}/{self.epoch}/{index}")
        for attempt in range(MAX_REDRAWS):
            path = self.paths[index if attempt == 0 else rng.randrange(len(self.paths))]
            stride = rng.randint(self.min_frame_delta, self.max_frame_delta) if self.train else self.min_frame_delta
            try:
                frames = decode_clip(path, self.n_frames, stride, rng if self.train else random.Random(0), self.loop_short_clips)
            except ClipError as error:
                self.skipped[error.reason] += 1
                continue
            video = torch.from_numpy(frames).permute(0, 3, 1, 2)
            video = resize_and_crop(video, self.height, self.width, rng if self.train else None)
            if self.train and self.horizontal_flip and rng.random() < 0.5:
                video = video.flip(-1)
            return video.contiguous()
        raise RuntimeError(f"{MAX_REDRAWS} draws in a row failed ({dict(self.skipped)}); check the dataset")
