"""The clip index: a folder, annotation JSON or JSONL/CSV index read into numpy arrays, split into
training and held-out clips by a hash of each path, or by whole source videos (the index's "source")."""

from __future__ import annotations

import csv
import hashlib
import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from training.base.formats import PREPARED_MARKER, VIDEO_EXTENSIONS
from training.base.storage import ClipCache, ObjectStore, StorageUnavailable, is_remote
from training.data.decode import ClipError

INDEX_FIELDS = ("path", "frames", "fps", "duration", "width", "height", "rotation", "codec", "size", "mtime")


class IndexFormatError(ValueError):
    """An index file that cannot be read; the message names the file and line."""


class DataFailureError(RuntimeError):
    """Too many clip draws failed: the dataset needs fixing, not more retries."""


class ClipIndex:
    """Relative paths (one UTF-8 blob + offsets) and per-clip metadata in numpy arrays.
    Unknown values are -1 (frames, width, height) or 0 (fps). The root is a folder or an
    s3://bucket/prefix (`store`), whose clips are read through a local `cache` (training/base/storage.py).
    `sources`: the video each clip was cut from (an index's "source" field; "" unknown), kept as
    codes into `source_names`, so that validation can hold out whole source videos."""

    def __init__(self, root, paths: list[str], frames=None, fps=None, width=None, height=None, rotation=None,
                 cache: ClipCache | None = None, retry_s: float = 600.0, sources=None):
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
        sources = list(sources) if sources is not None else [""] * n
        self.source_names = sorted(set(sources))
        codes = {name: code for code, name in enumerate(self.source_names)}
        self.source_codes = np.asarray([codes[name] for name in sources], dtype=np.int32)

    def source(self, i: int) -> str:
        """The source video clip i was cut from, "" when the index does not say."""
        return self.source_names[self.source_codes[i]]

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
                         self.width[indices], self.height[indices], self.rotation[indices],
                         sources=[self.source(i) for i in indices])
        part.store, part.cache = self.store, self.cache
        return part

    def split(self, validation_fraction: float, validation_sources: str = "") -> tuple["ClipIndex", "ClipIndex"]:
        """Stable split by a hash of the relative path: adding files never moves old ones across.
        validation_sources (comma-separated source names, the index's "source" field): every clip cut
        from them is held out and no other, so no frame of a held-out video is trained on (the
        fraction is then unused); a name the index does not hold is an IndexFormatError."""
        if validation_sources:
            names = {name.strip() for name in validation_sources.split(",") if name.strip()}
            source = self.source if any(self.source_names) else self._folder_sources()
            known = {source(i) for i in range(len(self))}
            unknown = sorted(names - known)
            if unknown:
                known_text = ", ".join(sorted(n for n in known if n)) or "none: the index has no 'source' field"
                raise IndexFormatError(f"validation_sources: {', '.join(unknown)} is not a source of the clips in "
                                       f"{self.root} (their sources: {known_text})")
            held_out = [source(i) in names for i in range(len(self))]
            train = [i for i, h in enumerate(held_out) if not h]
            if not train:
                raise IndexFormatError(f"validation_sources={validation_sources} holds out every clip: leave one source "
                                       "to train on")
            return self.subset(train), self.subset([i for i, h in enumerate(held_out) if h])
        held_out = [is_validation(self.relative(i), validation_fraction) for i in range(len(self))]
        train = [i for i, h in enumerate(held_out) if not h]
        validation = [i for i, h in enumerate(held_out) if h]
        if not validation and len(train) > 1 and validation_fraction > 0:
            validation = [train.pop()]  # tiny folders: keep one held-out clip
        return self.subset(train), self.subset(validation)


    def _folder_sources(self):
        """A listed folder's sources from the index.jsonl beside its clips (scripts/make_real_clips.py
        writes one), as a function of the clip number; "" for a clip it does not name."""
        by_path = {}
        listing = None if self.store else Path(self.root) / "index.jsonl"
        if listing is not None and listing.is_file():
            for line in listing.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("path") and record.get("source"):
                    by_path[str(record["path"])] = str(record["source"])
        return lambda i: by_path.get(self.relative(i), "")


def is_validation(relative_path: str, fraction: float) -> bool:
    digest = hashlib.sha1(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


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
            cache=cache, retry_s=retry_s, sources=[str(r.get("source") or "") for r in records],
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
