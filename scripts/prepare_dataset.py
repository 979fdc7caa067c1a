"""Prepare a video corpus once so that training decodes small, short-GOP clips at its resolution.

    python -m scripts.prepare_dataset SOURCE OUT [--cover 480x720] [--segment-seconds 4] [--keyint 8] [--workers N]

SOURCE: a folder, an index (.jsonl, .json annotation, .csv; paths relative to its folder or to
--data-root) or an s3://bucket/prefix. OUT: a folder or an s3://bucket/prefix. Each source is
decoded once, front to back, cut into segments of --segment-seconds, scaled (keeping its aspect
ratio, never up) to the smallest size that covers --cover with the display rotation applied,
and encoded as H.264 with a keyframe every --keyint frames, so a training clip starting anywhere
decodes at most keyint - 1 frames it does not use. OUT receives:

    clips/<shard>/<name>-<hash>-<segment>.mp4   the segments
    shards/<shard>.json     the shard's sources, clips and failures, written when the shard is complete
    index.jsonl             every clip with its metadata (our index format, paths relative to OUT;
                            source, start and end seconds added)
    failures.jsonl          sources that failed: source, reason, detail, clips kept
    dataset.json            settings and summary, written last: training reads OUT through index.jsonl

Sources are prepared in parallel processes; a shard is --shard-size sources. A re-run after a kill
keeps the complete shards and redoes the rest. A broken source is counted and listed, never fatal;
a decoder that crashes its process costs that source (tried twice). Why MP4 files and a JSONL
index rather than tar shards: docs/data.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from training.base.files import unique_temporary
from training.base.launch import die_with_parent
from training.base.storage import ClipCache, ObjectStore, is_remote
from training.data.decode import cover_size
from training.data.index import ClipIndex, read_index


@dataclass(frozen=True)
class Settings:
    cover: tuple[int, int] = (480, 720)  # (height, width) every clip must cover after rotation
    segment_seconds: float = 4.0
    keyint: int = 8
    crf: int = 20
    preset: str = "veryfast"
    min_segment_frames: int = 16  # shorter tails are dropped


class Output:
    """OUT as a folder or an s3:// prefix: files are written locally (under a scratch folder for
    a store) and published with `publish`."""

    def __init__(self, location: str):
        self.location = location.rstrip("/") if is_remote(location) else location
        self.store = ObjectStore(self.location) if is_remote(location) else None
        self.local = Path(tempfile.mkdtemp(prefix="taehv-prepare-")) if self.store else Path(location)

    def publish(self, relative: str) -> None:
        """The local file becomes part of OUT (uploaded and removed locally for a store)."""
        if self.store:
            local = self.local / relative
            self.store.upload(local, relative)
            local.unlink()

    def write_text(self, relative: str, text: str) -> None:
        path = self.local / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = unique_temporary(path)
        temporary.write_text(text)
        temporary.replace(path)
        self.publish(relative)

    def read_json(self, relative: str) -> dict | None:
        try:
            if self.store:
                return json.loads(self.store.read(relative)) if self.store.exists(relative) else None
            return json.loads((self.local / relative).read_text())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self.store:
            shutil.rmtree(self.local, ignore_errors=True)


def clip_name(relative: str, segment: int) -> str:
    digest = hashlib.sha1(relative.encode()).hexdigest()[:8]
    return f"{Path(relative).stem[:60]}-{digest}-{segment:04d}.mp4"


def prepare_source(job: tuple) -> tuple[list[dict], dict | None]:
    """One source -> (clip records, failure or None). Runs in a worker process."""
    import av

    root, relative, shard, output, settings = job
    index = ClipIndex(root, [relative], cache=ClipCache(budget_bytes=0))  # a source from a bucket: a private copy, deleted after
    records: list[dict] = []
    segment = None  # (container, stream, path, relative path, first frame, frames written)

    def close_segment(keep: bool) -> None:
        nonlocal segment
        if segment is None:
            return
        container, stream, path, clip, first, count = segment
        segment = None
        for packet in stream.encode():
            container.mux(packet)
        container.close()
        if not keep or count < settings.min_segment_frames:
            path.unlink(missing_ok=True)
            return
        final = path.with_name(path.name.removeprefix("."))
        path.replace(final)
        fps = float(stream.codec_context.framerate)
        records.append({"path": clip, "frames": count, "fps": round(fps, 4), "duration": round(count / fps, 4),
                        "width": stream.width, "height": stream.height, "rotation": 0, "codec": "h264",
                        "size": final.stat().st_size, "source": relative, "start": round(first / fps, 4),
                        "end": round((first + count) / fps, 4)})
        output.publish(clip)

    try:
        with index.local_copy(0) as path, av.open(str(path)) as source:
            if not source.streams.video:
                return [], {"source": relative, "reason": "no_video_stream", "detail": "", "clips": 0}
            stream = source.streams.video[0]
            stream.thread_type = "AUTO"
            rate = stream.average_rate or stream.guessed_rate or Fraction(25)
            rate = Fraction(rate).limit_denominator(1001)
            per_segment = max(1, round(settings.segment_seconds * float(rate)))
            scaling, rotation, number = None, 0, 0
            for frame in source.decode(stream):
                if scaling is None:  # the first frame fixes rotation and size for the source
                    rotation = round(int(getattr(frame, "rotation", 0) or 0) / 90) % 4
                    shown = (frame.width, frame.height) if rotation % 2 else (frame.height, frame.width)
                    height, width = cover_size(*shown, *settings.cover)
                    if height * width > shown[0] * shown[1]:  # never upscale: training scales small clips itself
                        height, width = shown
                    height, width = height - height % 2, width - width % 2  # yuv420p
                    stored = (width, height) if rotation % 2 else (height, width)
                    scaling = {"format": "rgb24", "height": stored[0], "width": stored[1], "interpolation": "AREA"}
                if segment is None:
                    clip = f"clips/{shard:05d}/{clip_name(relative, number // per_segment)}"
                    local = output.local / clip
                    local.parent.mkdir(parents=True, exist_ok=True)
                    temporary = local.with_name("." + local.name)
                    container = av.open(str(temporary), mode="w", format="mp4")
                    encoder = container.add_stream("libx264", rate=rate)
                    encoder.height, encoder.width, encoder.pix_fmt = height, width, "yuv420p"
                    encoder.options = {"crf": str(settings.crf), "preset": settings.preset,
                                       "x264-params": f"keyint={settings.keyint}:min-keyint={settings.keyint}:scenecut=0"}
                    segment = (container, encoder, temporary, clip, number, 0)
                array = frame.to_ndarray(**scaling)
                if rotation:
                    array = np.rot90(array, k=rotation)  # counter-clockwise, as the display matrix asks
                container, encoder, temporary, clip, first, count = segment
                out_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")
                for packet in encoder.encode(out_frame):
                    container.mux(packet)
                segment = (container, encoder, temporary, clip, first, count + 1)
                number += 1
                if count + 1 == per_segment:
                    close_segment(keep=True)
            close_segment(keep=True)
            if number == 0:
                return [], {"source": relative, "reason": "no_frames", "detail": "", "clips": 0}
            if not records:
                return [], {"source": relative, "reason": "too_short", "clips": 0,
                            "detail": f"{number} frames, a segment needs {settings.min_segment_frames}"}
    except Exception as error:  # a broken or truncated source: the finished segments stay
        try:
            close_segment(keep=False)
        except Exception:
            pass
        reason = getattr(error, "reason", "decode_error")
        return records, {"source": relative, "reason": reason, "detail": str(error)[:300], "clips": len(records)}
    return records, None


def plan_shards(sources: list[str], shard_size: int) -> list[list[str]]:
    return [sources[i : i + shard_size] for i in range(0, len(sources), shard_size)]


def prepare_dataset(source: str, out: str, *, cover: tuple[int, int] = (480, 720), segment_seconds: float = 4.0,
                    keyint: int = 8, crf: int = 20, preset: str = "veryfast", workers: int | None = None,
                    shard_size: int = 64, data_root: str | None = None, show_progress: bool = True) -> dict:
    """Prepares SOURCE into OUT (see the module docstring); returns the summary written to dataset.json."""
    from tqdm import tqdm

    source = str(source)
    index = read_index(source, data_root)
    root = str(index.root)
    sources = sorted(index.relative(i) for i in range(len(index)))
    settings = Settings(tuple(cover), segment_seconds, keyint, crf, preset)
    output = Output(str(out))
    started = time.monotonic()
    try:
        shards = plan_shards(sources, shard_size)
        done: dict[int, dict] = {}
        recorded = json.loads(json.dumps(asdict(settings)))  # as a shard file holds them (lists, not tuples)
        for number, members in enumerate(shards):  # a complete shard of the same sources and settings is kept
            previous = output.read_json(f"shards/{number:05d}.json")
            if previous and previous.get("sources") == members and previous.get("settings") == recorded:
                done[number] = previous
        pending = {number: {"sources": members, "clips": [], "failures": [], "left": len(members)}
                   for number, members in enumerate(shards) if number not in done}
        for number in pending:  # segments a killed run left half-written
            for leftover in (output.local / "clips" / f"{number:05d}").glob(".*.mp4"):
                leftover.unlink(missing_ok=True)
        jobs = [(number, relative) for number, shard in pending.items() for relative in shard["sources"]]
        bar = tqdm(total=len(sources), initial=len(sources) - len(jobs), unit="source", desc="preparing", disable=not show_progress)
        attempts: dict[tuple[int, str], int] = {}

        def finish(job: tuple[int, str], records: list[dict], failure: dict | None) -> None:
            shard = pending[job[0]]
            shard["clips"] += records
            if failure:
                shard["failures"].append(failure)
            shard["left"] -= 1
            bar.update(1)
            if shard["left"] == 0:
                shard["clips"].sort(key=lambda r: r["path"])
                entry = {"sources": shard["sources"], "settings": asdict(settings), "clips": shard["clips"], "failures": shard["failures"]}
                output.write_text(f"shards/{job[0]:05d}.json", json.dumps(entry) + "\n")
                done[job[0]] = entry

        queue = list(jobs)
        while queue:
            # workers die with this process (a kill of it leaves no orphan decoding on)
            with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1, initializer=die_with_parent) as pool:
                running: dict = {}
                try:
                    while queue or running:
                        while queue and len(running) < 4 * (workers or os.cpu_count() or 1):
                            job = queue.pop(0)
                            running[pool.submit(prepare_source, (root, job[1], job[0], output, settings))] = job
                        finished, _ = wait(running, return_when=FIRST_COMPLETED)
                        for future in finished:
                            job = running.pop(future)
                            finish(job, *future.result())
                except BrokenProcessPool:  # a decoder crashed a worker: which source did is unknown,
                    for job in running.values():  # so each one in flight gets a second try
                        attempts[job] = attempts.get(job, 0) + 1
                        if attempts[job] >= 2:
                            finish(job, [], {"source": job[1], "reason": "worker_crashed",
                                             "detail": "the decoding process died twice on it", "clips": 0})
                        else:
                            queue.append(job)
        bar.close()
        clips = sorted((clip for shard in done.values() for clip in shard["clips"]), key=lambda r: r["path"])
        failures = [failure for number in sorted(done) for failure in done[number]["failures"]]
        summary = {
            "source": source, "settings": asdict(settings), "sources": len(sources), "clips": len(clips),
            "hours": round(sum(clip["duration"] for clip in clips) / 3600, 4), "bytes": sum(clip["size"] for clip in clips),
            "failed_sources": len(failures), "seconds": round(time.monotonic() - started, 1),
        }
        output.write_text("index.jsonl", "".join(json.dumps(clip) + "\n" for clip in clips))
        output.write_text("failures.jsonl", "".join(json.dumps(failure) + "\n" for failure in failures))
        output.write_text("dataset.json", json.dumps(summary, indent=2) + "\n")  # last: the dataset is complete
        return summary
    finally:
        output.close()


def parse_cover(text: str) -> tuple[int, int]:
    try:
        height, width = (int(part) for part in text.lower().split("x"))
        return height, width
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cover {text!r}: use HEIGHTxWIDTH, e.g. 480x720") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.prepare_dataset", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="folder, index file (.jsonl/.json/.csv) or s3://bucket/prefix of source videos")
    parser.add_argument("out", help="folder or s3://bucket/prefix to write the prepared dataset to")
    parser.add_argument("--data-root", help="with an index as SOURCE: the folder its paths are relative to")
    parser.add_argument("--cover", type=parse_cover, default=(480, 720),
                        help="HEIGHTxWIDTH every clip must cover (the largest crop you train at; default 480x720)")
    parser.add_argument("--segment-seconds", type=float, default=4.0)
    parser.add_argument("--keyint", type=int, default=8, help="frames between keyframes (default 8)")
    parser.add_argument("--crf", type=int, default=20, help="x264 quality, lower is better (default 20)")
    parser.add_argument("--preset", default="veryfast", help="x264 preset (default veryfast)")
    parser.add_argument("--workers", type=int, help="processes (default: all cores)")
    parser.add_argument("--shard-size", type=int, default=64, help="sources per shard, the unit kept after a kill")
    args = parser.parse_args(argv)
    if args.keyint < 1 or args.segment_seconds <= 0 or args.shard_size < 1:
        parser.error("--keyint and --shard-size must be at least 1 and --segment-seconds positive")
    if not is_remote(args.out) and not is_remote(args.source) and Path(args.out).resolve().is_relative_to(Path(args.source).resolve()):
        parser.error(f"OUT {args.out} is inside SOURCE {args.source}: its clips would become sources; choose another folder")
    for location in (args.source, args.out):
        if is_remote(location):
            problem = ObjectStore(location, retry_s=0).problem()
            if problem:
                print(f"error: {problem.replace('data_root=', '', 1)}", file=sys.stderr)
                return 2
    if not is_remote(args.source) and not Path(args.source).exists():
        print(f"error: SOURCE {args.source} does not exist", file=sys.stderr)
        return 2
    summary = prepare_dataset(args.source, args.out, cover=args.cover, segment_seconds=args.segment_seconds, keyint=args.keyint,
                              crf=args.crf, preset=args.preset, workers=args.workers, shard_size=args.shard_size,
                              data_root=args.data_root, show_progress=sys.stderr.isatty())
    print(f"{summary['sources']} sources -> {summary['clips']} clips, {summary['hours']:.2f} hours, "
          f"{summary['bytes'] / 1e9:.2f} GB; {summary['failed_sources']} sources failed "
          f"({args.out.rstrip('/')}/failures.jsonl); {summary['seconds']:.0f} s")
    return 0 if summary["clips"] else 1


if __name__ == "__main__":
    sys.exit(main())
