"""First-run preparation of shared folders: one builder per folder, the others wait; a dead
builder's lock is taken over; a failed build leaves nothing marked."""

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from training.base.prepare_once import MARKER_NAME, STARTED_NAME, is_prepared, lock_path, prepare_once
from training.data.index import scan_videos


def slow_build(folder: str, log: str) -> None:
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    time.sleep(1.0)
    (Path(folder) / "data.txt").write_text("complete")


def prepare_and_read(folder: str, log: str, results) -> None:
    built = prepare_once(Path(folder), lambda: slow_build(folder, log), "test data", log=lambda text: None)
    results.put((built, (Path(folder) / "data.txt").read_text()))


def test_two_processes_build_once_and_both_read_the_finished_folder(tmp_path):
    folder, log = tmp_path / "shared", tmp_path / "builds.log"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=prepare_and_read, args=(str(folder), str(log), results)) for _ in range(2)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    assert sorted(built for built, _ in outcomes) == [False, True]
    assert [text for _, text in outcomes] == ["complete", "complete"]  # the waiter read only the finished folder
    assert len(log.read_text().split()) == 1 and is_prepared(folder) and not lock_path(folder).exists()


def test_a_dead_builders_lock_is_taken_over(tmp_path):
    folder = tmp_path / "shared"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock_path(folder).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": 0}))
    messages = []
    assert prepare_once(folder, lambda: (folder / "data.txt").write_text("x"), "test data", log=messages.append)
    assert any("is gone; taking over" in m for m in messages) and is_prepared(folder)


def test_a_lock_from_another_host_that_stops_refreshing_is_stale(tmp_path):
    folder = tmp_path / "shared"
    lock_path(folder).write_text(json.dumps({"host": "other-node", "pid": 1, "started": 0}))
    started = time.monotonic()
    assert prepare_once(folder, lambda: None, "test data", stale_after_s=1.0, poll_s=0.05, log=lambda text: None)
    assert 1.0 <= time.monotonic() - started < 20


def test_a_failed_build_releases_the_lock_and_marks_nothing(tmp_path):
    folder = tmp_path / "shared"

    def broken():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        prepare_once(folder, broken, "test data", log=lambda text: None)
    assert not lock_path(folder).exists() and not (folder / MARKER_NAME).exists()
    assert (folder / STARTED_NAME).is_file()  # a half-built folder of ours, not the user's
    assert prepare_once(folder, lambda: None, "test data", log=lambda text: None)  # the next try builds


def test_a_users_own_folder_is_read_never_written(tmp_path):
    folder = tmp_path / "my_videos"
    folder.mkdir()
    (folder / "holiday.mp4").write_bytes(b"mine")
    assert not prepare_once(folder, lambda: (folder / "sample_0000.mp4").write_bytes(b"x"), "test data", log=lambda t: None)
    assert sorted(p.name for p in folder.iterdir()) == ["holiday.mp4"]


def test_sample_clip_writers_leave_no_scannable_temporary_files(tmp_path):
    """Temporary names are hidden and have no video suffix: a scan during the writing sees only whole clips."""
    script = ("import sys; from pathlib import Path; from training.data.synthetic_clips import make_sample_videos; "
              "make_sample_videos(Path(sys.argv[1]), count=2, n_frames=8)")
    writers = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "clips")], cwd=REPO_ROOT) for _ in range(2)]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]  # the old fixed .partial.mp4 names collided here
    assert scan_videos(tmp_path / "clips") == ["sample_0000.mp4", "sample_0001.mp4"]
    assert sorted(p.name for p in (tmp_path / "clips").iterdir()) == [MARKER_NAME, "index.jsonl", "sample_0000.mp4", "sample_0001.mp4"]
