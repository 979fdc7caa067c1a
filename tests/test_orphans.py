"""A kill -9 of the launcher's process group (a scheduler's or the OOM killer's group kill) while its
agent or ranks are still starting leaves no process of the run behind (issue 62): each knows from
its environment which process must be its parent, and ends itself when that one is already gone."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, free_port

LAUNCHER = str(REPO_ROOT / "train_taehv_h100.sh")

# A slow start on a loaded machine, made long: the process sleeps before the first line of its
# program runs (before any import of it), after leaving a marker that it is being held.
HOLD_SITE = '''
import os, sys, time

role, seconds, folder = os.environ.get("TEST_HOLD", "::").split(":", 2)
is_rank = bool(sys.argv) and sys.argv[0].endswith("taehv_train.py")
is_agent = sys.orig_argv[1:3] == ["-m", "training.base.launch"]
if (role == "rank" and is_rank) or (role == "agent" and is_agent):
    open(os.path.join(folder, f"{role}-{os.getpid()}"), "w").close()
    time.sleep(float(seconds))
'''
HOLD_S = 6


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


def run_processes(run_dir: Path) -> list:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(run_dir) in " ".join(process.info["cmdline"] or []):
                found.append(process)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("processes, held", [(1, "rank"), (2, "rank"), (1, "agent")])
def test_a_group_kill_while_the_run_starts_leaves_no_process_of_it(processes, held, tmp_path, clips):
    """The launcher's group is killed while every rank (or the agent) is held at its start, before
    its program's first line; a process that then goes on finds its parent gone (its death signal
    would be tied to init) and must end itself instead of training on as an orphan."""
    run_dir, markers = tmp_path / "run", tmp_path / "held"
    markers.mkdir()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HOLD_SITE)
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")])),
           "TEST_HOLD": f"{held}:{HOLD_S}:{markers}"}
    launcher = subprocess.Popen([LAUNCHER, str(processes), "test", "--output-dir", str(run_dir), "--set", f"data_root={clips}",
                                 "--max-steps", "500"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(markers.iterdir())) < (processes if held == "rank" else 1):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[0][-3000:]
            time.sleep(0.1)
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        killed = time.monotonic()
        alive = run_processes(run_dir)
        while alive and time.monotonic() < killed + HOLD_S + 5:  # the held ones wake after HOLD_S
            time.sleep(0.5)
            alive = run_processes(run_dir)
        assert not alive, [" ".join(p.cmdline()) for p in alive]
    finally:  # ends what the launcher left, whatever failed above
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        for process in run_processes(run_dir):
            with contextlib.suppress(Exception):
                process.kill()
