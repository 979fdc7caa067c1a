"""Video clips for training, from millions of files of any size, codec and quality.

Path of one sample: index entry -> seek to the keyframe before the start -> decode forward,
taking `n_frames` frames at a stride -> rotation -> resize (keep aspect) to cover H x W -> crop
(random for training, centred for validation) -> optional flip -> uint8 T,3,H,W.

Sources (`read_index`): a folder (scanned recursively), the users' annotation JSON
`{"list": [{"path": "rel/path.mp4", ...}]}`, or our JSONL / CSV index written by
`scripts/build_index.py` (fields in INDEX_FIELDS; only `path` is required; paths relative to the
data root). The index lives in numpy arrays, so a million entries cost tens of MB that forked
workers share, not hundreds of MB of Python objects each.

Every sample is a function of (seed, epoch, global index); `EpochShardSampler` gives each rank
disjoint indices and can start mid-epoch for an exact resume. A file that cannot give a clip
is replaced by another draw (bounded, no recursion) and reported with the batch, so counters
reach the training logs even from worker processes; `FailureTracker` stops training when too
many draws fail.

Preview what the model will see: python -m training.dataset SOURCE --height 480 --width 720 --n-frames 13
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import random
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Sampler

from training.shared_memory import SharedMemoryFull
from training.storage import ClipCache, ObjectStore, StorageUnavailable, is_remote

VIDEO_EXTENSIONS = {".mp4", ".mkv", ".mov", ".webm", ".avi", ".m4v", ".mpg", ".mpeg", ".ts"}
INDEX_FIELDS = ("path", "frames", "fps", "duration", "width", "height", "rotation", "codec", "size", "mtime")
SKIP_REASONS = ("open_error", "no_video_stream", "decode_error", "too_short", "no_frames")


class ClipError(Exception):
    """A file that cannot give the requested clip; `reason` is one of SKIP_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class DataFailureError(RuntimeError):
    """Too many clip draws failed: the dataset needs fixing, not more retries."""


class IndexFormatError(ValueError):
    """An index file that cannot be read; the message names the file and line."""


# ------------------------------------------------------------------------------------------------
# Index
# ------------------------------------------------------------------------------------------------


class ClipIndex:
    """Relative paths (one UTF-8 blob + offsets) and per-clip metadata in numpy arrays.
    Unknown values are -1 (frames, width, height) or 0 (fps). The root is a folder or an
    s3://bucket/prefix (`store`), whose clips are read through a local `cache` (training/storage.py)."""

    def __init__(self, root, paths: list[str], frames=None, fps=None, width=None, height=None, rotation=None,
                 cache: ClipCache | None = None, retry_s: float = 600.0):
        self.store = ObjectStore(str(root), retry_s) if is_remote(root) else None
        self.root = self.store.url if self.store else Path(root)
        self.cache = (cache or ClipCache()) if self.store else None
        encoded = [p.encode() for p in paths]
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self._offsets[1:])
        self._blob = np.frombuffer(b"".join(encoded), dtype=np.uint8) if encoded else np.zeros(0, np.uint8)
        n = len(paths)
        self.frames = np.asarray(frames if frames is not None else [-1] * n, dtype=np.int32)
        self.fps = np.asarray(fps if fps is not None else [0.0] * n, dtype=np.float32)
        self.width = np.asarray(width if width is not None else [-1] * n, dtype=np.int32)
        self.height = np.asarray(height if height is not None else [-1] * n, dtype=np.int32)
        self.rotation = np.asarray(rotation if rotation is not None else [0] * n, dtype=np.int16)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def relative(self, i: int) -> str:
        return self._blob[self._offsets[i] : self._offsets[i + 1]].tobytes().decode()

    def location(self, i: int) -> str:
        """Where clip i lives, for messages: a path or an s3:// URL."""
        return f"{self.root}/{self.relative(i)}" if self.store else str(self.root / self.relative(i))

    def path(self, i: int) -> Path:
        """Clip i's local path (a folder root only; see local_copy)."""
        if self.store:
            raise ValueError(f"{self.root} is object storage: use local_copy({i})")
        return self.root / self.relative(i)

    def lasting_path(self, i: int) -> Path:
        """Clip i as a local file that stays: the file itself, or its copy in the cache."""
        if not self.store:
            return self.root / self.relative(i)
        keep = self.cache if self.cache.budget_bytes > 0 else ClipCache(self.cache.folder)
        return keep.fetch(self.store, self.relative(i))

    @contextmanager
    def local_copy(self, i: int):
        """A local file of clip i for the decoder: the file itself, or a cached copy of the object
        (a missing object is a broken clip, ClipError open_error)."""
        if not self.store:
            yield self.root / self.relative(i)
            return
        try:
            path = self.cache.fetch(self.store, self.relative(i))
        except Exception as error:
            if isinstance(error, StorageUnavailable):
                raise
            raise ClipError("open_error", f"{self.location(i)}: {error}") from None
        try:
            yield path
        finally:
            self.cache.release(path)

    def subset(self, indices) -> "ClipIndex":
        indices = list(indices)
        part = ClipIndex(self.root, [self.relative(i) for i in indices], self.frames[indices], self.fps[indices],
                         self.width[indices], self.height[indices], self.rotation[indices])
        part.store, part.cache = self.store, self.cache
        return part

    def split(self, validation_fraction: float) -> tuple["ClipIndex", "ClipIndex"]:
        """Stable split by a hash of the relative path: adding files never moves old ones across."""
        held_out = [is_validation(self.relative(i), validation_fraction) for i in range(len(self))]
        train = [i for i, h in enumerate(held_out) if not h]
        validation = [i for i, h in enumerate(held_out) if h]
        if not validation and len(train) > 1 and validation_fraction > 0:
            validation = [train.pop()]  # tiny folders: keep one held-out clip
        return self.subset(train), self.subset(validation)


def is_validation(relative_path: str, fraction: float) -> bool:
    digest = hashlib.sha1(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


PREPARED_MARKER = "dataset.json"  # written last by scripts/prepare_dataset.py, beside its index.jsonl


def scan_videos(root: Path) -> list[str]:
    """Relative paths of the video files under root, sorted."""
    root = Path(root)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.suffix.lower() in VIDEO_EXTENSIONS and p.is_file())


def list_videos(root: str | Path, retry_s: float = 600.0) -> list[str]:
    """Relative paths of the video files under a folder or an s3:// prefix, sorted."""
    if is_remote(root):
        return [relative for relative, _ in ObjectStore(str(root), retry_s).list(VIDEO_EXTENSIONS)]
    return scan_videos(Path(root))


def is_prepared_dataset(root: str | Path, retry_s: float = 600.0) -> bool:
    """A folder or prefix written by scripts/prepare_dataset.py (read through its index.jsonl)."""
    if is_remote(root):
        return ObjectStore(str(root), retry_s).exists(PREPARED_MARKER)
    return (Path(root) / PREPARED_MARKER).is_file()


def _records_to_index(root, records: list[dict], source, cache: ClipCache | None, retry_s: float) -> ClipIndex:
    def number(record, key, default, kind):
        value = record.get(key)
        return default if value in (None, "") else kind(float(value))

    try:
        return ClipIndex(
            root,
            [str(r["path"]) for r in records],
            [number(r, "frames", -1, int) for r in records],
            [number(r, "fps", 0.0, float) for r in records],
            [number(r, "width", -1, int) for r in records],
            [number(r, "height", -1, int) for r in records],
            [number(r, "rotation", 0, int) for r in records],
            cache=cache, retry_s=retry_s,
        )
    except KeyError:
        raise IndexFormatError(f"{source}: every entry needs a 'path'") from None
    except (TypeError, ValueError) as error:
        raise IndexFormatError(f"{source}: a metadata field is not a number ({error})") from None


def read_index(source: str | Path, data_root: str | Path | None = None, cache: ClipCache | None = None,
               retry_s: float = 600.0) -> ClipIndex:
    """A folder or s3:// prefix (through its index.jsonl when scripts/prepare_dataset.py wrote it,
    else every video file under it), an annotation JSON ({"list": [...]}), or a JSONL / CSV index
    (a local file or an s3:// object)."""
    source = str(source).rstrip("/") if is_remote(source) else str(source)
    suffix = Path(source).suffix.lower()
    if Path(source).is_dir() or (is_remote(source) and suffix not in (".json", ".jsonl", ".csv")):
        if is_prepared_dataset(source, retry_s):
            return read_index(f"{source}/index.jsonl", source, cache, retry_s)
        return ClipIndex(source, list_videos(source, retry_s), cache=cache, retry_s=retry_s)
    root = str(data_root) if data_root else (source.rpartition("/")[0] if is_remote(source) else str(Path(source).parent))
    if is_remote(source):
        parent, _, name = source.rpartition("/")
        try:
            text = ObjectStore(parent, retry_s).read(name).decode()
        except Exception as error:  # the store down, a missing object, a refused request, not UTF-8
            raise IndexFormatError(f"index {source} cannot be read: {error}") from None
    else:
        if not Path(source).is_file():
            raise IndexFormatError(f"index {source} does not exist")
        try:
            text = Path(source).read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise IndexFormatError(f"index {source} cannot be read: {error}") from None
    if suffix == ".json":
        try:
            records = json.loads(text)["list"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise IndexFormatError(f"{source}: expected {{\"list\": [{{\"path\": ...}}, ...]}} ({error})") from None
    elif suffix == ".jsonl":
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise IndexFormatError(f"{source}: line {number} is not JSON ({error})") from None
    elif suffix == ".csv":
        records = list(csv.DictReader(text.splitlines()))
    else:
        raise IndexFormatError(f"index {source}: use a folder, .json (annotation), .jsonl or .csv")
    return _records_to_index(root, records, source, cache, retry_s)


def probe_video(path: Path) -> dict:
    """Container metadata without decoding the stream. Rotation comes from the first decoded
    frame's display matrix (PyAV has no stream-level getter), so one frame is decoded."""
    import av

    try:
        container = av.open(str(path))
    except Exception as error:
        raise ClipError("open_error", f"{path}: {error}") from None
    with container:
        if not container.streams.video:
            raise ClipError("no_video_stream", str(path))
        stream = container.streams.video[0]
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        duration = float(stream.duration * stream.time_base) if stream.duration else (container.duration or 0) / 1e6
        try:
            first = next(container.decode(stream))
        except Exception as error:
            raise ClipError("decode_error", f"{path}: {error}") from None
        return {
            "frames": stream.frames or -1,
            "fps": round(fps, 4),
            "duration": round(duration, 4),
            "width": stream.codec_context.width,
            "height": stream.codec_context.height,
            "rotation": int(getattr(first, "rotation", 0) or 0),
            "codec": stream.codec_context.name,
        }


# ------------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------------


def choose_window(frame_count: int, n_frames: int, min_delta: int, max_delta: int, rng: random.Random) -> tuple[int, int]:
    """(start, stride) of a clip inside `frame_count` frames; strides the clip cannot fit are not drawn."""
    if frame_count < 1 or (n_frames - 1) * min_delta + 1 > frame_count:
        raise ClipError("too_short", f"{frame_count} frames, need {(n_frames - 1) * min_delta + 1}")
    longest = min(max_delta, (frame_count - 1) // max(n_frames - 1, 1)) if n_frames > 1 else max_delta
    stride = rng.randint(min_delta, max(min_delta, longest))
    span = (n_frames - 1) * stride + 1
    return rng.randrange(frame_count - span + 1), stride


def cover_size(height: int, width: int, target_height: int, target_width: int) -> tuple[int, int]:
    """Smallest size with the same aspect ratio that covers the target (up- or downscaling)."""
    scale = max(target_height / height, target_width / width)
    return max(target_height, round(height * scale)), max(target_width, round(width * scale))


@dataclass
class Decoded:
    frames: list[np.ndarray]  # h,w,3 uint8 as stored (scaled when asked)
    rotation: int  # degrees, from the display matrix
    seen: int  # frames the stream has up to the last one decoded
    decoded: int  # frames the decoder produced (from the keyframe before the start)


def decode_frames(path: Path, wanted: list[int], cover: tuple[int, int] | None = None, threads: int = 2) -> Decoded:
    """Frames at the given (sorted) indices, by seeking to the keyframe before the first one and
    decoding forward. Frame indices are times x average fps, so variable-rate files and wrong
    header counts work. With `cover` (H, W), frames are scaled during the RGB conversion
    (libswscale) so that, once rotated, they cover H x W; without it they keep their stored size."""
    import av

    try:
        container = av.open(str(path))
    except Exception as error:
        raise ClipError("open_error", f"{path}: {error}") from None
    frames: list[np.ndarray] = []
    rotation, seen, decoded = 0, 0, 0
    with container:
        if not container.streams.video:
            raise ClipError("no_video_stream", str(path))
        stream = container.streams.video[0]
        # frame and slice threads, a fixed few: PyAV's default (one per core) times workers times
        # ranks oversubscribes a node
        stream.thread_type = "AUTO"
        stream.thread_count = threads
        fps = float(stream.average_rate or stream.guessed_rate or 25)
        time_base = float(stream.time_base)
        start_pts = stream.start_time or 0
        if wanted[0] > 0:
            container.seek(start_pts + int(wanted[0] / fps / time_base), stream=stream, backward=True, any_frame=False)
        targets = iter(wanted)
        target = next(targets)
        scaling: dict = {"format": "rgb24"}
        try:
            for frame in container.decode(stream):
                decoded += 1
                index = round((frame.pts - start_pts) * time_base * fps) if frame.pts is not None else seen
                seen = max(seen, index + 1)
                while target is not None and index >= target:  # a gap takes the next frame
                    if not frames:  # the first kept frame fixes rotation and scaling for the clip
                        rotation = int(getattr(frame, "rotation", 0) or 0)
                        if cover:
                            scaling.update(_scaling(frame.height, frame.width, rotation, cover))
                    frames.append(frame.to_ndarray(**scaling))
                    target = next(targets, None)
                if target is None:
                    break
        except Exception as error:
            raise ClipError("decode_error", f"{path}: {error}") from None
    return Decoded(frames, rotation, seen, decoded)


def header_frame_count(path: Path) -> int:
    """Frame count from the container header, else duration x fps (an estimate that read_clip
    corrects when decoding finds fewer frames); 1,000,000 when neither is known."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if stream.frames:
                return stream.frames
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            seconds = float(stream.duration * stream.time_base) if stream.duration else (container.duration or 0) / 1e6
            return round(seconds * fps) if seconds and fps else 1_000_000
    except Exception as error:
        raise ClipError("open_error", f"{path}: {error}") from None


def zoomed_cover(height: int, width: int, rotation: int, cover: tuple[int, int], u: float, min_side: int) -> tuple[int, int]:
    """The size to scale a stored frame to so that an H x W crop of it shows a region whose shorter
    side is min_side + u * (largest - min_side) pixels of the original (largest: the biggest
    region of the training aspect in the frame; no zoom when that is already below min_side)."""
    quarter_turn = round(rotation / 90) % 2 == 1
    shown_h, shown_w = (width, height) if quarter_turn else (height, width)
    target_h, target_w = cover
    largest = min(target_h, target_w) / max(target_h / shown_h, target_w / shown_w)
    side = largest if largest <= min_side else min_side + u * (largest - min_side)
    zoom = largest / side
    return math.ceil(target_h * zoom), math.ceil(target_w * zoom)


def _scaling(height: int, width: int, rotation: int, cover: tuple[int, int]) -> dict:
    """swscale arguments for a stored frame whose rotated view must cover `cover` (H, W)."""
    quarter_turn = round(rotation / 90) % 2 == 1
    shown = (width, height) if quarter_turn else (height, width)
    new_h, new_w = cover_size(*shown, *cover)
    stored_h, stored_w = (new_w, new_h) if quarter_turn else (new_h, new_w)
    if (stored_h, stored_w) == (height, width):
        return {}
    shrinking = stored_h * stored_w < height * width
    return {"height": stored_h, "width": stored_w, "interpolation": "AREA" if shrinking else "BILINEAR"}


def read_clip(path: Path, frame_count: int, n_frames: int, min_delta: int, max_delta: int,
              rng: random.Random, loop_short: bool, cover: tuple[int, int] | None = None,
              threads: int = 2) -> tuple[np.ndarray, int, list[int]]:
    """(n_frames,H,W,3 uint8 with rotation applied and scaled to cover `cover` when given, frames
    the decoder produced, the stream frame index behind each output frame). A wrong or missing
    header count is corrected by what decoding finds, with one more seek."""
    decoded_total = 0
    if frame_count < 1:
        frame_count = header_frame_count(path)
    for attempt in range(2):
        try:
            start, stride = choose_window(frame_count, n_frames, min_delta, max_delta, rng)
        except ClipError:
            if not loop_short or frame_count < 1:
                raise
            start, stride = 0, 1
        wanted = [start + i * stride for i in range(n_frames)]
        if loop_short and frame_count < wanted[-1] + 1:
            wanted = sorted({w % frame_count for w in wanted})
        result = decode_frames(path, wanted, cover, threads)
        decoded_total += result.decoded
        frames, rotation = result.frames, result.rotation
        if len(frames) == len(wanted):
            break
        if result.seen == 0:
            raise ClipError("no_frames", str(path))
        frame_count = result.seen  # the header promised more than the stream holds
    else:
        raise ClipError("decode_error", f"{path}: stream ended after {result.seen} frames")
    sources = [wanted[i % len(wanted)] for i in range(n_frames)]  # loops a short clip
    frames = [frames[i % len(frames)] for i in range(n_frames)]
    return _rotated(np.stack(frames), rotation), decoded_total, sources


def _rotated(video: np.ndarray, rotation: int) -> np.ndarray:
    if rotation:
        video = np.rot90(video, k=round(rotation / 90) % 4, axes=(1, 2))
    return np.ascontiguousarray(video)


def read_frames(path: Path, sources: list[int], cover: tuple[int, int] | None = None) -> tuple[np.ndarray, int]:
    """The frames read_clip returned for these `sources` (a recipe stored in a latent cache), with
    rotation and cover scaling applied the same way."""
    wanted = sorted(set(sources))
    result = decode_frames(path, wanted, cover)
    if len(result.frames) != len(wanted):
        raise ClipError("decode_error", f"{path}: stream ended after {result.seen} frames, the cached clip needs frame {wanted[-1]}")
    by_index = dict(zip(wanted, result.frames))
    return _rotated(np.stack([by_index[s] for s in sources]), result.rotation), result.decoded


def resize_and_crop(video: torch.Tensor, height: int, width: int, rng: random.Random | None,
                    origin: tuple[int, int] | None = None) -> tuple[torch.Tensor, tuple[int, int]]:
    """T,3,h,w uint8 -> (T,3,height,width uint8, (top, left)): scale (keeping aspect, up or down)
    to cover, then crop at `origin` when given, else random when rng is given, else centred."""
    h, w = video.shape[-2:]
    new_h, new_w = cover_size(h, w, height, width)
    if (new_h, new_w) != (h, w):  # frames from read_clip(cover=...) already cover: crop only
        video = F.interpolate(video.float(), size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
        video = video.round().clamp(0, 255).to(torch.uint8)
    if origin is None:
        origin = ((rng.randrange(new_h - height + 1), rng.randrange(new_w - width + 1)) if rng
                  else ((new_h - height) // 2, (new_w - width) // 2))
    top, left = origin
    return video[..., top : top + height, left : left + width], (top, left)


def zoomed_crop(video: torch.Tensor, height: int, width: int, u: float, min_side: int,
                rng: random.Random) -> tuple[torch.Tensor, tuple[int, int]]:
    """Scale augmentation: T,3,h,w uint8 frames at their own size (rotation applied) -> the
    height x width crop, at a random (top, left), of the frame scaled to cover zoomed_cover(...).
    Zooming in, only the crop is computed (bilinear sampling of the original at the positions the
    whole scaled frame would use: the same pixels, without scaling a 1080p frame up to 17x);
    zooming out, the frame is scaled down first, as no larger than the original."""
    h, w = video.shape[-2:]
    zoomed_h, zoomed_w = cover_size(h, w, *zoomed_cover(h, w, 0, (height, width), u, min_side))  # keeping the aspect
    top, left = rng.randrange(zoomed_h - height + 1), rng.randrange(zoomed_w - width + 1)
    if zoomed_h * zoomed_w <= h * w:
        scaled = F.interpolate(video.float(), size=(zoomed_h, zoomed_w), mode="bilinear", antialias=True, align_corners=False)
        crop = scaled[..., top : top + height, left : left + width]
    else:  # source positions as torch's bilinear (align_corners=False) maps them, clamped at the border
        ys = ((torch.arange(top, top + height) + 0.5) * (h / zoomed_h) - 0.5).clamp(0, h - 1)
        xs = ((torch.arange(left, left + width) + 0.5) * (w / zoomed_w) - 0.5).clamp(0, w - 1)
        grid = torch.stack(torch.meshgrid(xs / max(w - 1, 1) * 2 - 1, ys / max(h - 1, 1) * 2 - 1, indexing="xy"), dim=-1)
        crop = F.grid_sample(video.float(), grid.expand(video.shape[0], height, width, 2), mode="bilinear",
                             padding_mode="border", align_corners=True)
    return crop.round().clamp(0, 255).to(torch.uint8), (top, left)


# ------------------------------------------------------------------------------------------------
# Dataset, sampler, failure accounting
# ------------------------------------------------------------------------------------------------


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


class VideoClipDataset(Dataset):
    """dataset[(epoch, index)] -> {"video": uint8 T,3,H,W, "skipped": [(reason, path), ...],
    "decoded_frames": frames the decoder produced for it, "recipe": how to read the same clip
    again (clip: relative path, sources: stream frame indices, crop: (top, left), flip)}.
    Training draws (start, stride, crop, flip) from a generator seeded by (seed, epoch, index);
    validation takes a centred crop at the smallest stride from a fixed start."""

    def __init__(self, index: ClipIndex, spec: ClipSpec, train: bool = True, seed: int = 0, max_redraws: int = 16):
        if len(index) == 0:
            raise DataFailureError(f"no video files under {index.root}: check data_root / index_path")
        self.index, self.spec, self.train, self.seed, self.max_redraws = index, spec, train, seed, max_redraws

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key) -> dict:
        crash_if_injected()
        epoch, index = key if isinstance(key, tuple) else (0, key)
        rng = random.Random(f"{self.seed}/{epoch}/{index}")
        spec, skipped, decoded = self.spec, [], 0
        for attempt in range(self.max_redraws):
            i = index if attempt == 0 else rng.randrange(len(self.index))
            max_delta = spec.max_frame_delta if self.train else spec.min_frame_delta
            window_rng = rng if self.train else random.Random(i)
            zoom = (rng.random(), spec.crop_min_side) if self.train and spec.crop_min_side else None  # the same for every frame
            try:
                with self.index.local_copy(i) as path:
                    frames, decoded, sources = read_clip(path, int(self.index.frames[i]), spec.n_frames, spec.min_frame_delta,
                                                         max_delta, window_rng, spec.loop_short_clips,
                                                         cover=None if zoom else (spec.height, spec.width),  # zoom: own size
                                                         threads=spec.decode_threads)
            except ClipError as error:
                skipped.append((error.reason, self.index.location(i)))
                continue
            video = torch.from_numpy(frames).permute(0, 3, 1, 2)
            video, crop = (zoomed_crop(video, spec.height, spec.width, *zoom, rng) if zoom
                           else resize_and_crop(video, spec.height, spec.width, rng if self.train else None))
            flip = self.train and spec.horizontal_flip and rng.random() < 0.5
            recipe = {"clip": self.index.relative(i), "sources": sources, "crop": crop, "flip": flip}
            return {"video": (video.flip(-1) if flip else video).contiguous(), "skipped": skipped,
                    "decoded_frames": decoded, "recipe": recipe}
        raise DataFailureError(f"all {self.max_redraws} draws for sample {index} failed: {describe_skips(skipped)}")


def stack_in_shared_memory(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack; in a loader worker, straight into shared memory. torch would otherwise copy the
    batch there while pickling it in the worker queue's feeder thread, where a full /dev/shm only
    prints a traceback and the rank waits for that batch forever. Here the failure is raised in the
    worker's fetch and reaches the rank with the batch (SharedMemoryFull, training/faults.py)."""
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
    if "latents" in items[0]:  # from a latent cache (training/latent_cache.py)
        batch["latents"] = stack_in_shared_memory([item["latents"] for item in items])
    return batch


def describe_skips(skipped: list[tuple[str, str]], examples: int = 3) -> str:
    by_reason: dict[str, list[str]] = {}
    for reason, path in skipped:
        by_reason.setdefault(reason, []).append(path)
    return "; ".join(f"{reason} x{len(paths)} (e.g. {', '.join(sorted(set(paths))[:examples])})" for reason, paths in by_reason.items())


_samples_in_this_process = 0


def crash_if_injected() -> None:
    """For tests (TAEHV_FAULT_WORKER_SEGFAULT=<marker file>, on TAEHV_FAULT_RANK if set): the first
    data worker to reach its second sample while the marker does not exist creates it and dies by
    SIGSEGV, as a decoder crashing on one file among millions would."""
    global _samples_in_this_process
    import os

    marker = os.environ.get("TAEHV_FAULT_WORKER_SEGFAULT", "")
    if not marker or torch.utils.data.get_worker_info() is None:
        return
    if os.environ.get("TAEHV_FAULT_RANK", "") not in ("", os.environ.get("RANK", "0")):
        return
    _samples_in_this_process += 1
    if _samples_in_this_process == 2:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)


class FailureTracker:
    """Counts skipped draws by reason; `problem()` says, in one line, when their share exceeds the
    limit (judged after `min_draws`, so one early broken file does not stop a run). It never
    raises by itself: the ranks agree on stopping (training/agreement.py), so one rank's broken
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


# ------------------------------------------------------------------------------------------------
# Preview tool
# ------------------------------------------------------------------------------------------------


def save_strip(video: torch.Tensor, path: Path, frames: int = 6) -> None:
    """A PNG of up to `frames` evenly spaced frames side by side."""
    from PIL import Image

    picks = np.linspace(0, video.shape[0] - 1, min(frames, video.shape[0])).round().astype(int)
    strip = torch.cat([video[i] for i in picks], dim=-1).permute(1, 2, 0).numpy()
    Image.fromarray(strip).save(path)


def preview(source: str, height: int, width: int, n_frames: int, samples: int | None, out: Path | None,
            data_root: str | None = None, seed: int = 0, min_delta: int = 1, max_delta: int = 1, loop_short: bool = False) -> dict:
    index = read_index(source, data_root)
    spec = ClipSpec(n_frames, height, width, min_delta, max_delta, loop_short_clips=loop_short)
    dataset = VideoClipDataset(index, spec, train=True, seed=seed, max_redraws=1)
    keys = [(0, i % len(index)) for i in range(samples)] if samples else [(0, i) for i in range(len(index))]
    report = {"files": [], "ok": 0, "skipped": {}}
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for number, key in enumerate(keys):
        i = key[1]
        entry = {"path": index.location(i), "status": "ok", "reason": None}
        try:
            entry.update({k: v for k, v in probe_video(index.lasting_path(i)).items() if k in ("width", "height", "rotation")})
            item = dataset[(number, i)] if samples else dataset[key]
            entry["shape"] = list(item["video"].shape)
            report["ok"] += 1
            if out:
                save_strip(item["video"], out / f"{number:04d}_{Path(entry['path']).stem}.png")
        except (ClipError, DataFailureError) as error:
            reason = error.reason if isinstance(error, ClipError) else str(error).split("failed: ")[-1].split(" x")[0]
            entry.update(status="skipped", reason=reason)
            report["skipped"][reason] = report["skipped"].get(reason, 0) + 1
        report["files"].append(entry)
    return report


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m training.dataset", description="Preview the clips training will see.")
    parser.add_argument("source", help="folder, annotation JSON, or JSONL/CSV index")
    parser.add_argument("--data-root", help="folder the index paths are relative to (default: the index's folder)")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=720)
    parser.add_argument("--n-frames", type=int, default=13)
    parser.add_argument("--min-frame-delta", type=int, default=1)
    parser.add_argument("--max-frame-delta", type=int, default=1)
    parser.add_argument("--loop-short", action="store_true", help="loop clips shorter than needed instead of skipping")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--per-file", action="store_true", help="one clip per file (default)")
    group.add_argument("--samples", type=int, help="N random draws instead")
    parser.add_argument("--out", type=Path, help="write PNG strips here")
    parser.add_argument("--json", action="store_true", help="print one JSON summary")
    args = parser.parse_args(argv)
    try:
        report = preview(args.source, args.height, args.width, args.n_frames, args.samples, args.out, args.data_root,
                         min_delta=args.min_frame_delta, max_delta=args.max_frame_delta, loop_short=args.loop_short)
    except (IndexFormatError, DataFailureError) as error:
        print(f"error: {error}")
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for entry in report["files"]:
            detail = f"shape {entry.get('shape')}" if entry["status"] == "ok" else f"skipped: {entry['reason']}"
            size = f"{entry.get('width', '?')}x{entry.get('height', '?')} rot {entry.get('rotation', '?')}"
            print(f"{entry['status']:7s} {size:22s} {detail:28s} {entry['path']}")
        print(f"{report['ok']} ok, skipped: {report['skipped'] or 'none'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
