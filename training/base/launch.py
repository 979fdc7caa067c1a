"""`accelerate launch` for the launchers, speaking for the training:

    python -m training.base.launch <accelerate launch arguments> training/taehv_train.py --output-dir RUN ...

The training ends a start-up problem or a stop with one line of its own and an exit code (2
config or resume, 3 data, 4 a rank that stopped answering). accelerate and torchrun would bury
that line under their own report (a ChildFailedError or CalledProcessError traceback) and exit 1.
Here the agent runs in this process: its report and log records go to <run>/launch.log (when the
run folder exists; a start-up refusal writes nothing there), and this process exits with the
training's own code. A failure the training did not explain (a crash, a killed rank) gets one line
that names the rank and where the report is.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from training.base.fast_exit import exit_now

LOG_NAME = "launch.log"
LAUNCHER_PID = "TAEHV_LAUNCHER_PID"  # the launcher script's pid, which must be this agent's parent
AGENT_PID = "TAEHV_AGENT_PID"  # this agent's pid, which must be the parent of each training process it starts
ERROR_DIR = "TAEHV_STARTUP_ERROR_DIR"  # where ranks leave their one-line start-up error for this process to print
# How a run stopped by SIGTERM/SIGINT ends once its checkpoint is written: 128 + SIGTERM, as a process
# the signal ended reports. Not 0: a Kubernetes Job, a PyTorchJob or a platform's retry would record a
# preempted run as done and never restart it (docs/howto/train-multinode.md); --resume continues it.
STOPPED_BY_SIGNAL = 143
EXPLAINED = (2, 3, 4, STOPPED_BY_SIGNAL)  # exit codes whose one-line reason the training printed itself


class Recorder(logging.Handler):
    """Keeps the agent's log records for launch.log instead of the terminal."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: deque[str] = deque(maxlen=2000)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def run_dir_of(training_args: list[str]) -> Path | None:
    for flag, value in zip(training_args, training_args[1:]):
        if flag == "--output-dir":
            return Path(value)
    return None


def keep_report(run_dir: Path | None, lines, started: float) -> str:
    """Appends the agent's report to <run>/launch.log when this launch trained there (its train.log
    was written since `started`); '' otherwise: a refused start changes nothing in the folder."""
    trained = run_dir is not None and (run_dir / "train.log").is_file() and (run_dir / "train.log").stat().st_mtime >= started
    if not lines or not trained:
        return ""
    path = run_dir / LOG_NAME
    with path.open("a") as log:
        log.write("\n".join(lines) + "\n")
    return str(path)


def watchdog_reason(run_dir: Path | None) -> str:
    """SIGABRT on NCCL is its watchdog ending a collective that ran past its timeout (or failed):
    the process is gone before the training can print its own line, so say which timeout it was."""
    import json

    try:
        config = json.loads((run_dir / "resolved_config.json").read_text())
    except (OSError, TypeError, ValueError):
        config = {}
    timeouts = (f"step_timeout_s={config['step_timeout_s']} after the first step, nccl_timeout_s={config['nccl_timeout_s']} "
                "until then" if "step_timeout_s" in config else "step_timeout_s after the first step, nccl_timeout_s until then")
    return (f" (on NCCL: its watchdog, after a collective passed its timeout ({timeouts}) or failed: another rank "
            "stopped answering or left; the NCCL lines above name the collective)")


def die_with_parent(parent: int | None = None) -> None:
    """Linux SIGKILLs this process when its parent goes, by any signal. The launcher owns its agent
    this way (a SIGKILL of the launcher's process group does not reach the agent's own group), and
    each rank its agent (die_with_agent).

    `parent` is the pid the parent must be, known before this process started: a process whose
    parent went before this call reads init (or a subreaper) as its parent, and would tie its death
    signal to that and live on as an orphan; with `parent` it ends here instead. Without it, the
    parent as it is at this call (a pool worker's initializer, right after its fork)."""
    if sys.platform != "linux":
        return
    import ctypes

    expected = os.getppid() if parent is None else parent
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != expected:  # the parent went before this call, or before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_agent() -> None:
    """A training process's first act (training/taehv_train.py, before torch and the trainer load):
    under the launchers' agent, die with it, which AGENT_PID names (the agent starts its ranks as
    its own children: torchrun, or accelerate's plain subprocess for one process); under torchrun or
    `accelerate launch` alone (LOCAL_RANK), with the parent it has now."""
    if AGENT_PID in os.environ:
        die_with_parent(int(os.environ[AGENT_PID]))
    elif "LOCAL_RANK" in os.environ:
        die_with_parent()


def first_startup_error(folder: str) -> str:
    """The lowest rank's start-up line: every rank refuses the same inputs, and the first to exit
    gets the others terminated, maybe before they could print; so the agent prints it, once."""
    lines = sorted(Path(folder).glob("rank-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    return lines[0].read_text().strip() if lines else ""


def main(argv: list[str] | None = None) -> int:
    import shutil
    import tempfile

    launcher = os.environ.pop(LAUNCHER_PID, "")  # train_taehv_h100.sh names itself; a command typed by hand does not
    die_with_parent(int(launcher) if launcher else None)
    os.environ[AGENT_PID] = str(os.getpid())
    os.environ[ERROR_DIR] = tempfile.mkdtemp(prefix="taehv-launch-")
    try:
        return launch(argv)
    finally:
        shutil.rmtree(os.environ[ERROR_DIR], ignore_errors=True)


def launch(argv: list[str] | None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(argv)
    recorder = Recorder()
    agent_logger = logging.getLogger("torch.distributed.elastic")
    agent_logger.addHandler(recorder)
    agent_logger.propagate = False
    rank, code, started = 0, 0, time.time()
    try:
        launch_command(args)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        code = failure.exitcode
        recorder.lines.append(str(error))
    except subprocess.CalledProcessError as error:  # one process: accelerate ran it as a plain subprocess
        code = error.returncode
        recorder.lines.append(str(error))
    log = keep_report(run_dir_of(args.training_script_args), recorder.lines, started)
    if code in EXPLAINED and first_startup_error(os.environ[ERROR_DIR]):
        print(first_startup_error(os.environ[ERROR_DIR]), file=sys.stderr, flush=True)
    if code == 0 or code in EXPLAINED:
        return code
    where = f"; the launcher's report is in {log}" if log else ""
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
        why = watchdog_reason(run_dir_of(args.training_script_args)) if -code == signal.SIGABRT else ""
        print(f"training failed: rank {rank} was killed by {name}{why}{where}", file=sys.stderr, flush=True)
        return 128 - code
    print(f"training failed: rank {rank} exited with code {code} (its own output above says why){where}",
          file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    exit_now(main())
