"""The run folder: which folder a launch trains in, what it records of its settings, and what a
resume may change (docs/howto/resume.md#what-a-resume-may-change).

A run is its run folder. A fresh start records its launch (profile and command-line overrides) in
launch.json and every resolved key in resolved_config.json. A resume of a checkpoint into a run
folder that holds these restores the run's settings: the launch's own `--set`s may repeat them,
or change a key of RESUME_MAY_CHANGE (each change is printed, logged and recorded, the previous
resolved_config.json kept as resolved_config.until-step-N.json); any other change is refused in
one line. So the "continue with" command the launcher prints continues the very run.

No torch here: the launcher's first step (python -m training.plan --shell) runs this.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from training.base.files import write_json
from training.config.load import _check_type, build_config, launch_values, write_resolved_config
from training.config.schema import DERIVED_KEYS, SETTABLE_KEYS, ConfigError, ResumeError, TrainConfig, tagged
from training.run.checkpoint_files import complete_checkpoints

# What a resume may change: how long the run goes and how often it reports and saves, how its data
# is loaded, its limits and timeouts, switches that compute the same values, where the LPIPS files
# are, and the topology an elastic resume converts (training/run/elastic.py). Anything else (data,
# losses, learning rate, model, clip shape) would make it another run: branch it into a new folder.
# Each such key says so where it is declared: option(..., resume_may_change=True) in training/config/schema.py.
RESUME_MAY_CHANGE = frozenset(tagged("resume_may_change"))


RESOLVED = "resolved_config.json"


LAUNCH = "launch.json"


DEFAULT_RUN = re.compile(r"\d{8}_\d{6}")  # output/<timestamp>: the folders output/latest points at


@dataclass
class Run:
    """This launch's config, its run folder, the checkpoint it resumes (or None) and, on a resume
    of a recorded run, the keys it changes: (key, the run's value, this launch's value)."""

    config: TrainConfig
    run_dir: Path
    resume_from: Path | None
    restored: bool = False
    changes: list[tuple[str, object, object]] = field(default_factory=list)
    launch: dict = field(default_factory=dict)  # what launch.json records after this launch
    branch_of: Path | None = None  # the run folder a branch (--resume CKPT --output-dir NEW) continues

    def change_lines(self) -> list[str]:
        what = "branch" if self.branch_of is not None else "resume"
        return [f"{what} changes {key}: {old!r} -> {new!r}" for key, old, new in self.changes]


def find_resume_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """'auto': the newest complete checkpoint or None; 'latest': the same, but none is an error."""
    if resume not in ("auto", "latest"):
        path = Path(resume)
        if not path.is_dir():
            raise ResumeError(f"--resume {resume}: no such checkpoint folder")
        return path
    checkpoints = complete_checkpoints(run_dir)
    if not checkpoints and resume == "latest":
        raise ResumeError(f"--resume latest: no complete checkpoint in {run_dir / 'checkpoints'}: "
                          "start it without --resume, or use --resume auto")
    return checkpoints[-1] if checkpoints else None


def choose_run_dir(output_dir: str, config_output_dir: str, resume: str, several_machines: bool = False) -> Path:
    """--output-dir; else the config's output_dir; else the run being resumed (output/latest for
    latest/auto, a checkpoint's own run); else a new output/<timestamp>. Several machines need the
    folder named: each would otherwise pick its own timestamp or its own output/latest."""
    if output_dir or config_output_dir:
        return Path(output_dir or config_output_dir)
    if several_machines and resume in ("", "latest", "auto"):
        raise ConfigError("several machines train into one run folder, which each would otherwise name for itself "
                          "(its own output/<timestamp> or output/latest): pass --output-dir on storage every machine "
                          "sees, the same on each (e.g. --output-dir /shared/runs/run1)")
    if resume in ("latest", "auto"):
        latest = Path("output/latest")
        if not latest.is_dir():
            raise ResumeError(f"--resume {resume} without --output-dir needs output/latest: no earlier run found; "
                              "pass the run folder with --output-dir")
        return Path("output") / os.readlink(latest) if latest.is_symlink() else latest
    if resume:  # a checkpoint folder (find_resume_checkpoint checks it is one)
        return Path(resume).parent.parent
    return Path(f"output/{datetime.now():%Y%m%d_%H%M%S}")


def settings_at(run_dir: Path, checkpoint: Path) -> Path:
    """The resolved config a run trained its checkpoint with: a resume that changed keys at step M
    kept the one before as resolved_config.until-step-M.json, so a checkpoint of step N <= M was
    written under the first such file with M >= N; a later one under resolved_config.json."""
    step = int(checkpoint.name.rsplit("-", 1)[-1]) if re.fullmatch(r"checkpoint-\d+", checkpoint.name) else None
    kept = sorted((int(m.group(1)), path) for path in run_dir.glob("resolved_config.until-step-*.json")
                  if (m := re.fullmatch(r"resolved_config\.until-step-(\d+)\.json", path.name)))
    return next((path for until, path in kept if step is not None and until >= step), run_dir / RESOLVED)


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # tuples and lists alike


def load_run(profile_or_path: str, overrides: list[str] | None = None, num_processes: int | None = None,
             output_dir: str = "", resume: str = "", check_paths: bool = True,
             notes: list[str] | None = None, several_machines: bool = False) -> Run:
    """The config this launch trains with and where. Raises ConfigError with one line."""
    values, set_values, source = launch_values(profile_or_path, overrides)
    run_dir = choose_run_dir(output_dir, str(values.get("output_dir", "")), resume, several_machines)
    resume_from = find_resume_checkpoint(resume, run_dir) if resume else None
    own_overrides = {key: value for key, value in set_values.items() if key != "output_dir"}
    launch = {"profile": profile_or_path, "source": source, "overrides": own_overrides}
    # a resume continues its run folder's settings; a branch (a checkpoint of another run into a new
    # folder) those of the run it branches, with any key the command line gives changed
    branch_of = resume_from.parent.parent if resume_from is not None and not (run_dir / RESOLVED).is_file() else None
    recorded_dir = branch_of or run_dir
    recorded_path = settings_at(branch_of, resume_from) if branch_of is not None else run_dir / RESOLVED
    if resume_from is None or not recorded_path.is_file():  # a fresh run, or a checkpoint without its run's record
        config = build_config({**values, "output_dir": str(run_dir)}, num_processes, check_paths,
                              "max_steps" in set_values, notes, frozenset(set_values))
        return Run(config, run_dir, resume_from, launch=launch)

    recorded = json.loads(recorded_path.read_text())
    try:
        recorded_launch = json.loads((recorded_dir / LAUNCH).read_text())
    except (OSError, ValueError):  # a run from before launch.json: its resolved keys are all there is
        recorded_launch = {"source": source, "overrides": {}}
    restored = {key: recorded[key] for key in SETTABLE_KEYS if key in recorded}
    restored = {key: _check_type(key, value, str(recorded_path)) for key, value in restored.items()}
    new_topology = source != recorded_launch.get("source") or (
        num_processes is not None and num_processes != recorded.get("num_processes"))
    if new_topology:  # another profile or process count: its topology and intervals, unless the run pinned them
        for key in RESUME_MAY_CHANGE - set(recorded_launch.get("overrides", {})):
            restored[key] = values.get(key, TrainConfig.__dataclass_fields__[key].default)
    for key, value in own_overrides.items():
        if key in RESUME_MAY_CHANGE or branch_of is not None:
            restored[key] = value
        elif not _same(value, restored.get(key)):
            raise ResumeError(
                f"--resume {resume} in {run_dir}: --set {key}={value!r} would change the run's {key}={restored.get(key)!r}, "
                "which a resume keeps (docs/howto/resume.md#what-a-resume-may-change lists what it may change); "
                f"drop the --set to continue the run, or branch it: --resume {resume_from} --output-dir <new folder>")
    restored["output_dir"] = str(run_dir)
    pinned_keys = frozenset(own_overrides) | frozenset(recorded_launch.get("overrides", {}))
    config = build_config(restored, num_processes, check_paths, "max_steps" in set_values, notes, pinned_keys)
    after = config.to_dict()
    changes = [(key, recorded.get(key), after[key]) for key in SETTABLE_KEYS
               if key != "output_dir" and key not in DERIVED_KEYS and not _same(recorded.get(key), after[key])]
    pinned = {**recorded_launch.get("overrides", {}),
              **{k: v for k, v in own_overrides.items() if k in RESUME_MAY_CHANGE or branch_of is not None}}
    launch = {**recorded_launch, "overrides": pinned}
    if branch_of is not None:
        launch["branch_of"] = str(resume_from)
    return Run(config, run_dir, resume_from, restored=True, changes=changes, launch=launch, branch_of=branch_of)


def check_writable(run_dir: Path) -> None:
    """The run folder can be created and written, checked without writing into it (nothing is
    written into a run folder before the inputs pass)."""
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"output_dir={str(run_dir)!r} cannot be written (Not a directory): choose another --output-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"output_dir={str(run_dir)!r} cannot be written (Permission denied): choose another --output-dir")


LOCK = ".lock"


_held_locks: dict = {}  # run folder -> its open lock file: the lock lasts as long as this process


def in_use(run_dir: Path, holder: str) -> ResumeError:
    return ResumeError(f"run folder {run_dir} is in use by the training {holder}: wait for it to end or stop it, "
                       "or choose another --output-dir")


RELEASE_WAIT_S = 20.0  # a killed rank lets go of the lock when it has exited, which takes a moment


def check_not_in_use(run_dir: Path, wait_s: float = RELEASE_WAIT_S) -> None:
    """The launcher's first step on the first machine: refuse a folder a training holds, before
    anything starts (ranks do not check: rank 0 of this very launch may hold it already). A holder
    may be a training that was just killed and is still exiting (a relaunch by a job scheduler comes
    at once): it is waited for up to `wait_s`, saying so, before the refusal."""
    holder = run_folder_holder(run_dir)
    if holder:
        import sys

        print(f"run folder {run_dir} is held by the training {holder}: waiting up to {wait_s:.0f} s for it to end",
              file=sys.stderr, flush=True)
        deadline = time.monotonic() + wait_s
        while holder and time.monotonic() < deadline:
            time.sleep(0.2)
            holder = run_folder_holder(run_dir)
    if holder:
        raise in_use(run_dir, holder)


def run_folder_holder(run_dir: Path) -> str:
    """'process PID on HOST' when another training holds the run folder's lock, else ''."""
    import fcntl

    if run_dir.resolve() in _held_locks:  # this process: a test, or a library user running twice
        return ""
    try:
        with open(run_dir / LOCK) as lock:
            try:
                fcntl.lockf(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a training started by an older version held it so
            except OSError:  # EAGAIN or EACCES, as the platform reports a held record lock
                return lock.read().strip() or "another process"
    except OSError:  # no lock file: no training ever held it
        pass
    return ""


def lock_run_folder(run_dir: Path) -> None:
    """Rank 0 holds <run>/.lock while it trains (the kernel releases it when the process ends, a
    SIGKILL included): a second training on the same folder is refused in one line. A POSIX record
    lock (lockf), not flock: an flock is shared with every forked child (data-loader workers), which
    outlive a killed rank by seconds and would refuse the relaunch. Record locks are owned by this
    process alone; closing any descriptor of the file in this process would release it, so the file
    is opened here only (run_folder_holder skips a folder this process holds)."""
    import fcntl
    import socket

    if run_dir.resolve() in _held_locks:
        return
    lock = open(run_dir / LOCK, "a+")
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise in_use(run_dir, holder) from None
    lock.truncate(0)
    lock.write(f"process {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    _held_locks[run_dir.resolve()] = lock


def record_run(run: Run) -> None:
    """Rank 0, once the inputs passed: the run folder's lock, resolved_config.json and launch.json.
    A resume that changed nothing leaves them as they are; a changed one keeps the previous
    resolved config beside."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    lock_run_folder(run.run_dir)
    if run.restored and not run.changes and run.branch_of is None:
        return
    if run.restored and run.branch_of is None:
        step = run.resume_from.name.split("-")[-1]
        previous = run.run_dir / RESOLVED
        previous.replace(run.run_dir / f"resolved_config.until-step-{step}.json")
    write_resolved_config(run.config, run.run_dir)
    write_json(run.run_dir / LAUNCH, run.launch)
    if run.run_dir.parent.name == "output" and DEFAULT_RUN.fullmatch(run.run_dir.name):
        point_latest_at(run.run_dir)


def point_latest_at(run_dir: Path) -> None:
    """output/latest -> the newest default run folder (a run with its own --output-dir leaves it)."""
    latest = run_dir.parent / "latest"
    temporary = run_dir.parent / f".latest.{os.getpid()}.tmp"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(run_dir.name)
    temporary.replace(latest)
