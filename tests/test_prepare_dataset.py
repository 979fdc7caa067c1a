"""scripts/prepare_dataset.py on the real sample clips (../shared, skipped when absent): segments at
the cover size with short GOPs, broken and too-short sources listed, a killed run resumed with
its finished shards kept, and two processes training from the result through its index."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import pytest
from conftest import REPO_ROOT, SAMPLE_VIDEOS, free_port


def processes_naming(path) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(path).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_prepare_real_clips_resume_after_a_kill_and_train_two_processes(tmp_path):
    if not SAMPLE_VIDEOS.is_dir():
        pytest.skip(f"{SAMPLE_VIDEOS} not present (../shared is optional for a fresh clone)")
    out = tmp_path / "prepared"
    command = [sys.executable, "-m", "scripts.prepare_dataset", str(SAMPLE_VIDEOS), str(out), "--shard-size", "1",
               "--workers", "1", "--segment-seconds", "2"]
    first = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while len(list((out / "shards").glob("*.json"))) < 2:  # killed with some shards finished, others not
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    deadline = time.monotonic() + 10
    while processes_naming(out):  # its decoding workers die with it
        assert time.monotonic() < deadline, f"orphaned workers: {processes_naming(out)}"
        time.sleep(0.1)
    kept = {path.name: path.stat().st_mtime_ns for path in (out / "shards").glob("*.json")}
    assert not (out / "dataset.json").exists()

    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all((out / "shards" / name).stat().st_mtime_ns == mtime for name, mtime in kept.items())  # not redone
    summary = json.loads((out / "dataset.json").read_text())
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    failures = {f["source"]: f for f in map(json.loads, (out / "failures.jsonl").read_text().splitlines())}
    assert {source: f["reason"] for source, f in failures.items()} == {"corrupted.mp4": "decode_error", "rotated_90.mov": "too_short"}
    # the segments a broken source gave before its damage are kept, and counted with its failure
    assert failures["corrupted.mp4"]["clips"] == sum(c["source"] == "corrupted.mp4" for c in index)
    assert summary["clips"] == len(index) and summary["failed_sources"] == 2 and summary["sources"] == 9
    assert re.search(rf"9 sources -> {len(index)} clips, [\d.]+ hours, [\d.]+ GB; 2 sources failed", result.stdout)
    assert {clip["source"] for clip in index} - {"corrupted.mp4"} == {"apple.mp4", "bear.mp4", "cat.mp4", "cheesecake_256.mp4",
                                                                      "flipping_a_pancake.mkv", "nasa_13013.mp4", "teddy.mp4"}
    assert sorted(p.relative_to(out).as_posix() for p in (out / "clips").rglob("*") if p.is_file()) == sorted(c["path"] for c in index)
    for clip in index:
        with av.open(str(out / clip["path"])) as container:
            stream = container.streams.video[0]
            keyframes = [packet.is_keyframe for packet in container.demux(stream) if packet.size]
        assert min(stream.codec_context.height, stream.codec_context.width) <= 480  # the cover size, never more
        assert all(keyframes[i] for i in range(0, len(keyframes), 8)), clip["path"]  # a keyframe every 8 frames
        assert (clip["width"], clip["height"]) == (stream.codec_context.width, stream.codec_context.height)
    apple = next(c for c in index if c["source"] == "apple.mp4")  # 1296x720 -> covers 480x720 at 864x480
    assert (apple["width"], apple["height"], apple["frames"], apple["start"]) == (864, 480, 20, 0.0)

    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    train = subprocess.run([str(REPO_ROOT / "train_taehv_h100.sh"), "2", "test", "--output-dir", str(run_dir),
                            "--max-steps", "2", "--set", f"data_root={out}"], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr[-3000:]
    assert (run_dir / "final" / "taehv.pth").is_file()
    assert not list(run_dir.glob("data_index-*.jsonl"))  # read through the prepared index, not listed


def test_the_dry_run_says_the_decoding_cores_a_gpu_needs_and_warns_when_the_workers_fall_short():
    import json

    from training.config.load import load_config
    from training.plan.decode_budget import BENCHMARK, decode_budget_lines

    measured = json.loads(BENCHMARK.read_text())["core_s_per_clip"]
    assert measured["prepared"] <= measured["raw"] / 4  # the committed benchmark's claim (docs/data.md)
    config = load_config("h100", num_processes=8, check_paths=False)
    raw = decode_budget_lines(config, clips_per_s=10.0, prepared=False)
    assert raw[0].startswith(f"~{10 * measured['raw']:.1f} decoding cores per GPU at ~10.0 clips/s per GPU (raw clips")
    config.num_workers = max(1, int(10 * measured["raw"]) - 1)
    assert "warning: num_workers" in decode_budget_lines(config, clips_per_s=10.0, prepared=False)[-1]
    config.num_workers = int(10 * measured["prepared"]) + 1
    assert len(decode_budget_lines(config, clips_per_s=10.0, prepared=True)) == 1  # enough workers: no warning
    assert decode_budget_lines(load_config("test", num_processes=1, check_paths=False)) == []  # CPU profiles: none
