"""Data pipeline throughput and memory (a benchmark, not a test).

    python -m scripts.benchmark_data [--videos DIR] [--workers 1 2] [--clips 24] [--json OUT]

For each clip set (the sample videos in ../shared/data/videos when present, and synthetic 720p
clips made here): the raw sequential decode rate of the files (frames/s, PyAV, every frame),
and the training dataset's rate at 480x720x12 frames (random start, stride 1-3, resize + crop)
with 1 and N loader workers, in clips/s, delivered frames/s (frames in the clips) and decoded
frames/s (frames the decoder produced, from the keyframe before each start). `ratio_1worker` is
one worker's decoded frames/s over the raw rate: the pipeline's overhead on top of decoding. Then the resident and private memory of a loader worker
whose dataset holds a one-million-entry index.

Decode budget (`core_s_per_clip`, read by the dry run through training/plan/decode_budget.py): 1080p
H.264 sources with x264's default keyframe interval (250) made here (`raw`), and the same after
scripts/prepare_dataset.py (`prepared`); training clips drawn at the h100 profile's clip shape in
this process, one decoder thread, one torch thread: CPU seconds per clip (one core) and clips/s
of one worker. Only that part: --decode-cost-only.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from scripts.results import emit_result
from training.base.fast_exit import exit_now
from training.data.clips import ClipSpec, EpochShardSampler, VideoClipDataset
from training.data.index import ClipIndex, read_index
from training.data.synthetic_clips import render_clip, write_clip

SHARED_VIDEOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "videos"


def raw_decode_fps(paths: list[Path]) -> float:
    frames, start = 0, time.perf_counter()
    for path in paths:
        try:
            with av.open(str(path)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                for _ in container.decode(stream):
                    frames += 1
        except av.FFmpegError:
            continue  # a broken file counts the frames it gave
    return frames / (time.perf_counter() - start)


def loader_rate(index: ClipIndex, workers: int, clips: int, n_frames: int) -> dict:
    spec = ClipSpec(n_frames, 480, 720, 1, 3, horizontal_flip=True, loop_short_clips=True)
    dataset = VideoClipDataset(index, spec, train=True, seed=0)
    sampler = EpochShardSampler(max(len(index), 1), 1, seed=0)

    def keys():
        epoch = 0
        while True:
            sampler.set_position(epoch)
            yield from sampler
            epoch += 1

    class Draws(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            for number, key in enumerate(keys()):
                if number >= clips:
                    return
                if info is None or number % info.num_workers == info.id:
                    yield dataset[key]

    loader = DataLoader(Draws(), batch_size=None, num_workers=workers, prefetch_factor=4 if workers else None)
    iterator = iter(loader)
    next(iterator)  # worker start-up is not throughput
    start, count, decoded = time.perf_counter(), 0, 0
    for item in iterator:
        count += 1
        decoded += item["decoded_frames"]
    seconds = time.perf_counter() - start
    return {"clips_per_s": round(count / seconds, 3), "delivered_fps": round(count * n_frames / seconds, 2),
            "decoded_fps": round(decoded / seconds, 2)}


class IndexProbe(Dataset):
    """Each item: this worker's RSS and USS in MB after touching the index."""

    def __init__(self, index: ClipIndex):
        self.index = index

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        for j in range(0, len(self.index), 997):
            self.index.path(j)
        memory = psutil.Process().memory_full_info()
        return torch.tensor([memory.rss / 2**20, memory.uss / 2**20])


def index_memory(entries: int = 1_000_000, workers: int = 2) -> dict:
    paths = [f"videos/shard_{i // 1000:04d}/clip_{i:07d}.mp4" for i in range(entries)]
    index = ClipIndex("/data", paths, frames=np.full(entries, 120), fps=np.full(entries, 24.0))
    del paths
    array_mb = sum(a.nbytes for a in (index._blob, index._offsets, index.frames, index.fps, index.width,
                                      index.height, index.rotation)) / 2**20
    loader = DataLoader(IndexProbe(index), batch_size=None, num_workers=workers)
    readings = torch.stack(list(loader))
    return {"index_entries": entries, "index_arrays_mb": round(array_mb, 1),
            "rss_mb_per_worker_1m_index": round(readings[:, 0].max().item(), 1),
            "uss_mb_per_worker_1m_index": round(readings[:, 1].max().item(), 1)}


def synthetic_720p(folder: Path, count: int = 4, frames: int = 48) -> list[Path]:
    paths = []
    for i in range(count):
        path = folder / f"synthetic_720p_{i}.mp4"
        write_clip(path, render_clip(100 + i, frames, 720, 1280), fps=30)
        paths.append(path)
    return paths


def long_gop_sources(folder: Path, count: int, frames: int) -> list[Path]:
    """1080x1920 H.264 with keyint 250 (x264's default; phone and camera files look like this).
    Frames are synthetic scenes rendered at 270x480 and enlarged 4x: real texture costs the
    renderer too much at 1080p, and the decoder's cost is set by resolution and GOP."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"raw_1080p_{i}.mp4"
        small = render_clip(200 + i, frames, 270, 480)
        with av.open(str(path), mode="w") as container:
            stream = container.add_stream("libx264", rate=30)
            stream.height, stream.width, stream.pix_fmt = 1080, 1920, "yuv420p"
            stream.options = {"preset": "ultrafast", "crf": "23", "x264-params": "keyint=250:scenecut=0"}
            for frame in small:
                big = np.ascontiguousarray(frame.repeat(4, axis=0).repeat(4, axis=1))
                for packet in stream.encode(av.VideoFrame.from_ndarray(big, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        paths.append(path)
    return paths


def clip_cost(index: ClipIndex, spec: ClipSpec, clips: int) -> dict:
    """CPU seconds (this process, one core) and wall seconds per training clip drawn in-process."""
    dataset = VideoClipDataset(index, spec, train=True, seed=0)
    dataset[(0, 0)]  # first open: libraries warm
    cpu, wall = time.process_time(), time.perf_counter()
    for number in range(clips):
        dataset[(1, number % len(index))]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"core_s_per_clip": round(cpu / clips, 4), "clips_per_s_per_worker": round(clips / wall, 3)}


def decode_cost(scratch: Path, sources: int, frames: int, clips: int) -> dict:
    from scripts.prepare_dataset import prepare_dataset
    from training.config.load import load_config

    config = load_config("h100", num_processes=8, check_paths=False)
    spec = ClipSpec(config.n_frames, config.height, config.width, config.min_frame_delta, config.max_frame_delta,
                    config.horizontal_flip, decode_threads=1)
    long_gop_sources(scratch / "raw", sources, frames)
    started = time.perf_counter()
    summary = prepare_dataset(str(scratch / "raw"), str(scratch / "prepared"), workers=1, show_progress=False)
    prepare_s = time.perf_counter() - started
    measured = {name: clip_cost(read_index(scratch / name), spec, clips) for name in ("raw", "prepared")}
    core = {name: m["core_s_per_clip"] for name, m in measured.items()}
    return {
        "decode_cost_clip": f"{spec.n_frames} frames of {spec.height}x{spec.width}, stride {spec.min_frame_delta}-{spec.max_frame_delta} "
                            "(h100 profile), one decoder thread",
        "decode_cost_sources": f"{sources} x {frames} frames of 1080x1920 H.264, keyint 250",
        "core_s_per_clip": core,
        "clips_per_s_per_worker": {name: m["clips_per_s_per_worker"] for name, m in measured.items()},
        "prepared_over_raw": round(core["prepared"] / core["raw"], 4),
        "prepare_core_s_per_source_second": round(prepare_s / (sources * frames / 30), 3),
        "prepared_clips": summary["clips"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=Path, default=SHARED_VIDEOS)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 2])
    parser.add_argument("--clips", type=int, default=24)
    parser.add_argument("--n-frames", type=int, default=12)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--decode-cost-only", action="store_true", help="only the raw vs prepared decode budget")
    parser.add_argument("--sources", type=int, default=2, help="1080p long-GOP sources for the decode budget")
    parser.add_argument("--source-frames", type=int, default=300)
    parser.add_argument("--cost-clips", type=int, default=40, help="training clips drawn per set for the decode budget")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GB",
              "pyav": av.__version__, "n_frames": args.n_frames, "size": "480x720", "sets": {}}
    with tempfile.TemporaryDirectory() as scratch:
        result.update(decode_cost(Path(scratch) / "decode_cost", args.sources, args.source_frames, args.cost_clips))
        print(f"decode budget: {result['core_s_per_clip']} core-s per clip, {result['clips_per_s_per_worker']} clips/s per "
              f"worker; prepared / raw = {result['prepared_over_raw']}", flush=True)
        if args.decode_cost_only:
            emit_result(result, args.json)
            return 0
        sets = {"synthetic_720p": ClipIndex(scratch, [p.name for p in synthetic_720p(Path(scratch))])}
        if args.videos.is_dir():
            sets = {"sample_videos": read_index(args.videos), **sets}
        for name, index in sets.items():
            raw = raw_decode_fps([index.path(i) for i in range(len(index))])
            workers = {str(w): loader_rate(index, w, args.clips, args.n_frames) for w in args.workers}
            one = workers.get("1")
            result["sets"][name] = {"files": len(index), "raw_decode_fps": round(raw, 2), "workers": workers,
                                    "ratio_1worker": round(one["decoded_fps"] / raw, 3) if one else None}
            print(f"{name}: raw {raw:.1f} frames/s; " + "; ".join(
                f"{w} worker(s) {r['clips_per_s']} clips/s, {r['decoded_fps']} decoded frames/s" for w, r in workers.items()), flush=True)
    first = next(iter(result["sets"].values()))
    result.update(raw_decode_fps=first["raw_decode_fps"], workers=first["workers"], ratio_1worker=first["ratio_1worker"])
    result.update(index_memory())
    emit_result(result, args.json)
    return 0


if __name__ == "__main__":
    exit_now(main())
