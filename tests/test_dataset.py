import json
import random
import subprocess
import sys
import time

import av
import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, SAMPLE_VIDEOS
from torch.utils.data import DataLoader

from scripts.build_index import build_index
from training.data.synthetic_clips import make_sample_videos
from training.data.clips import (
    ClipSpec,
    DataFailureError,
    EpochShardSampler,
    FailureTracker,
    VideoClipDataset,
    collate_clips,
)
from training.data.decode import decode_frames
from training.data.index import ClipIndex, IndexFormatError, read_index

needs_samples = pytest.mark.skipif(not SAMPLE_VIDEOS.is_dir(), reason="../shared/data/videos not present")


@pytest.fixture(scope="module")
def sample_clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("samples")
    make_sample_videos(folder, count=8, n_frames=24)
    return folder


def full_decode(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def shared_dataset(height, width, n_frames=13, loop=False, max_redraws=1):
    spec = ClipSpec(n_frames, height, width, 1, 3, loop_short_clips=loop)
    return VideoClipDataset(read_index(SAMPLE_VIDEOS), spec, train=True, seed=0, max_redraws=max_redraws)


@needs_samples
@pytest.mark.parametrize("height, width", [(480, 720), (32, 48)])
def test_every_sample_file_gives_exact_clips_or_a_counted_skip(height, width):
    dataset = shared_dataset(height, width)
    outcomes = {}
    for i in range(len(dataset)):
        name = dataset.index.path(i).name
        try:
            item = dataset[(0, i)]
        except DataFailureError as error:
            outcomes[name] = str(error).split("failed: ")[1].split(" x")[0]
            continue
        assert item["video"].shape == (13, 3, height, width) and item["video"].dtype == torch.uint8
        outcomes[name] = "ok"
    assert outcomes.pop("corrupted.mp4") == "decode_error"
    assert outcomes.pop("rotated_90.mov") == "too_short"  # 3 frames, short-clip policy 'skip'
    assert set(outcomes.values()) == {"ok"}  # teddy (wrong header), the MKV without a count, ...


@needs_samples
def test_rotation_short_clip_loop_and_mkv():
    dataset = shared_dataset(64, 48, loop=True)
    names = [dataset.index.path(i).name for i in range(len(dataset))]
    rotated = dataset[(0, names.index("rotated_90.mov"))]["video"]
    assert rotated.shape == (13, 3, 64, 48)  # 3 frames looped to 13
    decoded = decode_frames(SAMPLE_VIDEOS / "rotated_90.mov", [0])
    assert decoded.rotation % 180 != 0 and decoded.frames[0].shape[:2] == (320, 568)  # stored landscape...
    from training.data.decode import read_clip

    clip, _, _ = read_clip(SAMPLE_VIDEOS / "rotated_90.mov", 3, 3, 1, 1, random.Random(0), False)
    assert clip.shape[1:3] == (568, 320)  # ...comes out portrait
    scaled, _, _ = read_clip(SAMPLE_VIDEOS / "rotated_90.mov", 3, 3, 1, 1, random.Random(0), False, cover=(64, 48))
    assert scaled.shape[1:3] == (85, 48)  # scaled while decoding, still portrait, covering 64x48
    mkv, decoded, _ = read_clip(SAMPLE_VIDEOS / "flipping_a_pancake.mkv", -1, 13, 2, 2, random.Random(3), False)
    assert mkv.shape == (13, 240, 426, 3) and decoded >= 25


@needs_samples
def test_wrong_header_count_does_not_break_sampling():
    from training.data.decode import read_clip

    # teddy.mp4 claims 142 frames and has 141: windows that end on the last frame still decode
    for seed in range(20):
        clip, _, _ = read_clip(SAMPLE_VIDEOS / "teddy.mp4", 142, 13, 11, 11, random.Random(seed), False)
        assert clip.shape == (13, 480, 368, 3)


@needs_samples
@pytest.mark.parametrize("name, indices", [("bear.mp4", [40, 43, 46, 49]), ("nasa_13013.mp4", [200, 201, 250])])
def test_seeking_gives_the_same_frames_as_a_full_decode(name, indices):
    reference = full_decode(SAMPLE_VIDEOS / name)
    decoded = decode_frames(SAMPLE_VIDEOS / name, indices)
    assert all(np.array_equal(frame, reference[i]) for frame, i in zip(decoded.frames, indices))
    assert decoded.decoded < len(reference)  # seeking did not decode the whole file


def test_seeking_on_synthetic_clips(sample_clips):
    path = sorted(sample_clips.glob("*.mp4"))[3]
    reference = full_decode(path)
    indices = [len(reference) - 9, len(reference) - 5, len(reference) - 1]
    decoded = decode_frames(path, indices)
    assert all(np.array_equal(frame, reference[i]) for frame, i in zip(decoded.frames, indices))


def test_same_seed_same_samples_with_0_and_2_workers(sample_clips):
    dataset = VideoClipDataset(read_index(sample_clips / "index.jsonl"), ClipSpec(8, 32, 48, 1, 3, True), seed=7)

    def batches(workers):
        sampler = EpochShardSampler(len(dataset), 2, seed=7)
        sampler.set_position(1)
        loader = DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=workers, collate_fn=collate_clips)
        return [b["video"] for b in loader]

    inline, parallel = batches(0), batches(2)
    assert len(inline) == 4 and all(torch.equal(a, b) for a, b in zip(inline, parallel))


def test_ranks_see_disjoint_indices_and_resume_continues_exactly():
    ranks = [list(EpochShardSampler(103, 4, rank, 3, seed=1)) for rank in range(3)]
    indices = [set(i for _, i in r) for r in ranks]
    assert all(len(r) == 8 * 4 for r in ranks)  # 103 // 3 // 4 = 8 whole batches per rank
    assert not (indices[0] & indices[1] or indices[0] & indices[2] or indices[1] & indices[2])
    straight = list(EpochShardSampler(103, 4, 1, 3, seed=1))
    resumed = EpochShardSampler(103, 4, 1, 3, seed=1)
    resumed.set_position(0, 5)
    assert list(resumed) == straight[5 * 4 :]
    other_epoch = EpochShardSampler(103, 4, 1, 3, seed=1)
    other_epoch.set_position(1)
    assert list(other_epoch) != straight


def broken_folder(tmp_path, count=5):
    folder = tmp_path / "broken"
    folder.mkdir()
    for i in range(count):
        (folder / f"broken_{i}.mp4").write_bytes(b"not a video" * (i + 1))
    return folder


def test_failure_fraction_rule_names_files_and_reasons(tmp_path, sample_clips):
    tracker = FailureTracker(0.05, min_draws=20)
    tracker.update([], samples=10)
    assert tracker.problem() == ""
    tracker.update([("decode_error", "/data/a.mp4"), ("too_short", "/data/b.mp4")], samples=8)
    message = tracker.problem()
    assert "2 of 20 clip draws failed (10.0% > max_failed_fraction 5.0%)" in message
    assert "decode_error x1 (e.g. /data/a.mp4)" in message and "too_short x1" in message


def test_all_broken_folder_ends_with_an_error_not_a_hang(tmp_path):
    dataset = VideoClipDataset(read_index(broken_folder(tmp_path)), ClipSpec(4, 32, 32), seed=0)
    loader = DataLoader(dataset, batch_size=2, sampler=EpochShardSampler(5, 2), num_workers=2, collate_fn=collate_clips)
    start = time.monotonic()
    with pytest.raises(DataFailureError, match=r"all 16 draws for sample \d+ failed: open_error x16"):
        next(iter(loader))
    assert time.monotonic() - start < 60


def test_mostly_broken_folder_trips_the_fraction_rule(tmp_path, sample_clips):
    folder = broken_folder(tmp_path, count=6)
    for path in sorted(sample_clips.glob("*.mp4"))[:2]:
        (folder / path.name).write_bytes(path.read_bytes())
    dataset = VideoClipDataset(read_index(folder), ClipSpec(4, 32, 32), seed=0)
    tracker = FailureTracker(0.05, min_draws=20)
    for epoch in range(20):
        for index in range(len(dataset)):
            tracker.update(dataset[(epoch, index)]["skipped"], 1)
        if tracker.problem():
            break
    assert "open_error" in tracker.problem() and tracker.draws < 20 * len(dataset)


def test_build_index_good_broken_and_other_files_then_incremental(tmp_path, sample_clips):
    folder = tmp_path / "videos"
    (folder / "nested").mkdir(parents=True)
    good = sorted(sample_clips.glob("*.mp4"))
    for path in good[:3]:
        (folder / "nested" / path.name).write_bytes(path.read_bytes())
    (folder / "broken.mp4").write_bytes(b"garbage")
    (folder / "notes.txt").write_text("not a video")
    out = tmp_path / "index.jsonl"
    counts = build_index(folder, out, workers=2, show_progress=False)
    assert counts == {"files": 4, "probed": 4, "kept": 0, "indexed": 3, "rejected": 1}
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["path"] for r in records} == {f"nested/{p.name}" for p in good[:3]}
    assert all(r["frames"] > 0 and r["fps"] > 0 and r["width"] > 0 and r["codec"] == "h264" for r in records)
    rejects = [json.loads(line) for line in (tmp_path / "index.rejects.jsonl").read_text().splitlines()]
    assert rejects[0]["path"] == "broken.mp4" and rejects[0]["reason"] == "open_error"
    (folder / good[3].name).write_bytes(good[3].read_bytes())
    again = build_index(folder, out, workers=2, show_progress=False)
    assert again == {"files": 5, "probed": 1, "kept": 4, "indexed": 4, "rejected": 1}
    index = read_index(out, folder)
    assert len(index) == 4 and index.frames.min() > 0


def test_annotation_json_csv_and_bad_index_files(tmp_path, sample_clips):
    names = sorted(p.name for p in sample_clips.glob("*.mp4"))[:3]
    annotation = tmp_path / "annotation.json"
    annotation.write_text(json.dumps({"list": [{"path": n, "caption": "x"} for n in names]}))
    index = read_index(annotation, sample_clips)
    assert [index.relative(i) for i in range(3)] == names and index.path(0) == sample_clips / names[0]
    assert index.frames.tolist() == [-1, -1, -1]  # unknown: read while decoding
    table = tmp_path / "index.csv"
    table.write_text("path,frames,fps\n" + "".join(f"{n},40,24\n" for n in names))
    assert read_index(table, sample_clips).frames.tolist() == [40, 40, 40]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"path": "a.mp4"}\nnot json\n')
    with pytest.raises(IndexFormatError, match="bad.jsonl: line 2 is not JSON"):
        read_index(bad)
    with pytest.raises(IndexFormatError, match=r"expected \{\"list\""):
        (tmp_path / "wrong.json").write_text("[]")
        read_index(tmp_path / "wrong.json")


def test_split_is_stable_when_files_are_added():
    before = ClipIndex("/data", [f"clip_{i}.mp4" for i in range(500)])
    after = ClipIndex("/data", [f"clip_{i}.mp4" for i in range(1000)])
    _, validation_before = before.split(0.1)
    _, validation_after = after.split(0.1)
    names_before = {validation_before.relative(i) for i in range(len(validation_before))}
    names_after = {validation_after.relative(i) for i in range(len(validation_after))}
    assert names_before and names_before == {n for n in names_after if int(n[5:-4]) < 500}


def test_split_by_source_videos_holds_out_every_segment_of_them(tmp_path):
    """validation_sources: whole source videos held out, from the index's 'source' field or, for a
    listed folder, from the index.jsonl beside its clips; a name no clip has is refused."""
    paths = [f"{source}_{n}.mp4" for source in ("a", "b", "c") for n in range(4)]
    index = ClipIndex("/data", paths, sources=[f"{p[0]}.mp4" for p in paths])
    train, validation = index.split(0.5, "b.mp4, c.mp4")
    assert [validation.relative(i) for i in range(len(validation))] == paths[4:]
    assert [train.relative(i) for i in range(len(train))] == paths[:4]
    assert [validation.source(i) for i in range(len(validation))] == ["b.mp4"] * 4 + ["c.mp4"] * 4
    with pytest.raises(IndexFormatError, match=r"validation_sources: d.mp4 is not a source .*\(their sources: a.mp4, b.mp4, c.mp4\)"):
        index.split(0.5, "d.mp4")
    with pytest.raises(IndexFormatError, match="holds out every clip"):
        index.split(0.5, "a.mp4,b.mp4,c.mp4")
    (tmp_path / "index.jsonl").write_text("".join(json.dumps({"path": p, "source": f"{p[0]}.mp4"}) + "\n" for p in paths))
    _, validation = ClipIndex(tmp_path, paths).split(0.5, "a.mp4")  # a listed folder: sources from its index.jsonl
    assert [validation.relative(i) for i in range(len(validation))] == paths[:4]
    with pytest.raises(IndexFormatError, match="none: the index has no 'source' field"):
        ClipIndex("/nowhere", paths).split(0.5, "a.mp4")


def test_preview_tool_json(tmp_path, sample_clips):
    completed = subprocess.run(
        [sys.executable, "-m", "training.data.preview", str(sample_clips), "--height", "32", "--width", "48",
         "--n-frames", "8", "--out", str(tmp_path / "strips"), "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["ok"] == 8 and report["skipped"] == {}
    entry = report["files"][0]
    assert entry["status"] == "ok" and entry["shape"] == [8, 3, 32, 48] and entry["width"] > 0 and entry["rotation"] == 0
    assert len(list((tmp_path / "strips").glob("*.png"))) == 8


ENCODE_RED_HALF = """
import sys, av, numpy as np
path, encoder, pix_fmt = sys.argv[1:]
frames = np.zeros((12, 64, 96, 3), np.uint8)
frames[:, :, :48] = (200, 40, 40)
with av.open(path, mode="w") as container:
    stream = container.add_stream(encoder, rate=24)
    stream.height, stream.width, stream.pix_fmt = 64, 96, pix_fmt
    stream.options = {"x265-params": "log-level=error"} if encoder == "libx265" else {"preset": "12"}
    for array in frames:
        for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
"""


@pytest.mark.parametrize("encoder, pix_fmt", [("libx265", "yuv420p10le"), ("libx265", "yuv420p"), ("libsvtav1", "yuv420p"),
                                             ("libsvtav1", "yuv420p10le")])
def test_hevc_and_av1_at_8_and_10_bits_decode_to_uint8_rgb(tmp_path, encoder, pix_fmt):
    if encoder not in av.codecs_available:
        pytest.skip(f"this PyAV build has no {encoder} encoder")
    path = tmp_path / "clip.mkv"
    # In its own process: SVT-AV1 running as root switches its process to SCHED_FIFO 99, which
    # every later subprocess of this test session would inherit (busy-waiting ranks then starve).
    subprocess.run([sys.executable, "-c", ENCODE_RED_HALF, str(path), encoder, pix_fmt], check=True, timeout=120)
    with av.open(str(path)) as container:
        assert container.streams.video[0].codec_context.pix_fmt == pix_fmt
    dataset = VideoClipDataset(read_index(tmp_path), ClipSpec(8, 32, 48, 1, 1))
    video = dataset[(0, 0)]["video"]
    assert video.shape == (8, 3, 32, 48) and video.dtype == torch.uint8
    left = video[:, :, :, :20].float().mean((0, 2, 3))
    assert left[0] > 150 and left[1] < 80  # the red half stays red
