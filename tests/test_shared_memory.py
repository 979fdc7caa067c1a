"""Shared memory (/dev/shm) for the data loader (training/data/shared_memory.py): the estimate per node,
the dry run's and validate_setup's lines, the launcher's refusal when /dev/shm is too small, and
a run whose data worker runs out of it stopping in one line instead of hanging. The launches run
in a private mount namespace (unshare -m, as root) with a tiny tmpfs at /dev/shm, as a container
without --shm-size has."""

import functools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO_ROOT, free_port

LAUNCHER = str(REPO_ROOT / "train_taehv_h100.sh")
H100_BATCH = 4 * 9 * 3 * 480 * 720  # uint8 frames of one batch of the h100 profile: 37.3 MB
# the test profile with 2 workers and 4 clips of 8 x 128 x 128 a batch: 1.6 MB, more than a 1 MB /dev/shm holds
TINY_SHM_RUN = ["--set", "num_workers=2", "--set", "height=128", "--set", "width=128", "--set", "batch_size_per_gpu=4"]


@functools.cache
def private_shm_unavailable() -> str:
    """'' when this process can mount its own /dev/shm (unshare -m and a tmpfs, as root), else why not."""
    if not sys.platform.startswith("linux"):
        return "a private /dev/shm needs Linux mount namespaces"
    if os.geteuid() != 0:
        return "mounting a private /dev/shm (unshare -m + tmpfs) needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=30)
    return "" if probe.returncode == 0 else f"unshare -m with a tmpfs at /dev/shm failed: {probe.stderr.strip()[:200]}"


@pytest.fixture
def private_shm():
    if private_shm_unavailable():
        pytest.skip(private_shm_unavailable())


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=12, n_frames=24)
    return folder


def kill_leftovers(marker: str) -> None:
    """SIGKILL processes whose command line holds this test's own temporary path (a hung run's ranks
    and workers), by pid."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def launch(args: list[str], marker: str, shm_size: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The launcher with these arguments, under a private /dev/shm of shm_size when given; a run that
    does not end within timeout is a hang: killed, and the test fails."""
    command = [LAUNCHER, *args]
    if shm_size:
        command = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && exec "$@"', "sh", *command]
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        kill_leftovers(marker)
        out, err = process.communicate()
        pytest.fail(f"no end within {timeout:g} s (a hang); its output ends with:\n{(out + err)[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_h100_loader_needs_a_37_mb_batch_times_its_queue_per_process():
    from training.data.shared_memory import batch_bytes, loader_shared_memory_bytes
    from training.config.load import load_config

    h100 = load_config("h100", num_processes=8, check_paths=False)
    assert batch_bytes(h100) == H100_BATCH
    # 8 processes x (8 workers x prefetch_factor 2 + the batch trained on + the previous one)
    assert loader_shared_memory_bytes(h100, 8) == 8 * (8 * 2 + 2) * H100_BATCH
    assert 5.0e9 < loader_shared_memory_bytes(h100, 8) < 5.6e9
    sixteen = load_config("16gpu_h100", num_processes=16, check_paths=False)  # 2 nodes: 12 workers, prefetch 3
    assert loader_shared_memory_bytes(sixteen, 8) == 8 * (12 * 3 + 2) * H100_BATCH
    assert 11.0e9 < loader_shared_memory_bytes(sixteen, 8) < 11.6e9
    assert loader_shared_memory_bytes(load_config("test", check_paths=False)) == 0  # num_workers=0: none


def test_validate_setup_reports_shared_memory(monkeypatch):
    from scripts.validate_setup import Report, check_shared_memory
    from training.data import shared_memory
    from training.config.load import load_config

    h100 = load_config("h100", num_processes=8, check_paths=False)
    report = Report()
    monkeypatch.setattr(shared_memory, "shm_space", lambda path="/dev/shm": (64 * 2**30, 60 * 2**30))
    check_shared_memory(report, h100, 8)
    monkeypatch.setattr(shared_memory, "shm_space", lambda path="/dev/shm": (64 * 2**20, 64 * 2**20))  # docker's default
    check_shared_memory(report, h100, 8)
    check_shared_memory(report, load_config("h100", ["check_shared_memory=false"], num_processes=8, check_paths=False), 8)
    fits, small, unchecked = report.rows
    assert fits[:2] == ("PASS", "shared memory") and "need about 5.4 GB (8 processes x (8 workers x prefetch_factor 2 + 2) " \
        "x 37.3 MB batches); /dev/shm is 68.7 GB (64.4 GB free)" in fits[2]
    assert small[:2] == ("FAIL", "shared memory") and unchecked[0] == "WARN"
    assert small[2].startswith("/dev/shm is 67.1 MB (67.1 MB free) but the data loaders of this node need about 5.4 GB")
    assert "docker run --shm-size=7g" in small[2] and "emptyDir: {medium: Memory}" in small[2]


def test_dry_run_reports_shared_memory_per_node_and_warns_under_dockers_default(tmp_path):
    """The h100 dry run on a machine with Docker's default 64 MB /dev/shm (elsewhere: its own)."""
    tiny = "" if private_shm_unavailable() else "64m"
    result = launch(["8", "h100", "--dry-run", "--output-dir", str(tmp_path / "run")], str(tmp_path), shm_size=tiny or None)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out  # the h100 inputs are not on this machine
    assert ("shared memory per node: about 5.4 GB (8 processes x (8 workers x prefetch_factor 2 + 2) x 37.3 MB batches) "
            "for the data loaders; /dev/shm is") in out
    if tiny:
        assert "  warning: /dev/shm is 67.1 MB (67.1 MB free) but the data loaders of this node need about 5.4 GB" in out
        assert "too small here, make /dev/shm larger (docker run --shm-size=7g; Kubernetes: an emptyDir: {medium: Memory} " \
            "volume mounted at /dev/shm" in out


def test_launch_is_refused_in_one_line_when_dev_shm_is_too_small(private_shm, clips, tmp_path):
    run_dir = tmp_path / "run"
    result = launch(["1", "test", "--output-dir", str(run_dir), "--set", f"data_root={clips}", *TINY_SHM_RUN],
                    str(tmp_path), shm_size="1m", timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == "", result.stdout + result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: /dev/shm is 1.0 MB (1.0 MB free) but the data loaders of this node need about 9.4 MB "
                           "(1 process x (2 workers x prefetch_factor 2 + 2) x 1.6 MB batches) of shared memory"), line
    assert "docker run --shm-size=1g" in line and "emptyDir: {medium: Memory} volume mounted at /dev/shm" in line
    assert not run_dir.exists()  # nothing started


def test_a_worker_out_of_shared_memory_stops_the_run_in_one_line_instead_of_hanging(private_shm, clips, tmp_path):
    """With the refusal turned off, the first batch (1.6 MB) cannot be put in a 1 MB /dev/shm: before,
    the worker queue's feeder thread printed a traceback and the rank waited for that batch forever."""
    result = launch(["1", "test", "--output-dir", str(tmp_path / "run"), "--set", f"data_root={clips}", *TINY_SHM_RUN,
                     "--set", "check_shared_memory=false"], str(tmp_path), shm_size="1m", timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert "Traceback" not in out, out
    assert "(check_shared_memory=false: launching anyway)" in result.stderr
    stops = [line for line in result.stderr.splitlines() if line.startswith("stopped on rank 0:")]
    assert len(stops) == 1, out
    assert stops[0].startswith("stopped on rank 0: data loader out of shared memory on rank 0: a data worker could not put "
                               "its 1.6 MB batch in shared memory (No space left on device); /dev/shm is 1.0 MB"), stops[0]
    assert "need about 9.4 MB" in stops[0] and "docker run --shm-size=1g" in stops[0] and "emptyDir: {medium: Memory}" in stops[0]


class SignalledDataset:
    """A data worker that dies of this signal at its first sample."""

    def __init__(self, signum: int):
        self.signum = signum

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGBUS, signal.SIGSEGV], ids=["SIGBUS", "SIGSEGV"])
def test_a_worker_killed_by_sigbus_is_reported_as_shared_memory_not_a_bad_file(signum):
    from torch.utils.data import DataLoader

    from training.config.load import load_config
    from training.data.clips import FailureTracker
    from training.loop.batches import loader_batches

    config = load_config("test", ["num_workers=1", "persistent_workers=false"], check_paths=False)
    run = SimpleNamespace(config=config, loader=DataLoader(SignalledDataset(signum), batch_size=2, num_workers=1),
                          accelerator=SimpleNamespace(process_index=0), failures=FailureTracker(0.05),
                          storage_down="", shared_memory_full="")
    assert next(loader_batches(run)) is None  # the batch is lost either way
    if signum == signal.SIGBUS:  # a full /dev/shm: the run stops (train_step), naming it and the fix
        assert run.shared_memory_full.startswith("a data worker was killed by SIGBUS (a bus error: how a process dies "
                                                 "writing into a full /dev/shm); /dev/shm is "), run.shared_memory_full
        assert "--shm-size=" in run.shared_memory_full and not run.failures.counts
    else:  # a decoder crash on one file: skipped and counted, the run goes on
        assert run.shared_memory_full == "" and run.failures.counts["worker_died"] == config.batch_size_per_gpu
