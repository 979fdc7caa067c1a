"""First-run preparation of a shared folder: one process builds it, every other one waits.

Several ranks, or several nodes of one job that share a checkout, can start on a folder nobody
prepared (synthetic sample clips, an index, a cache). The first process to create the lock
`.<folder>.prepare.lock` beside the folder (O_EXCL, atomic on local filesystems and NFS v3+)
decides, while holding it: a folder with the completion marker `<folder>/.prepared` is done; an
existing folder that we never started (no `<folder>/.prepare-started`) belongs to the user and is
used as it is, never written into; otherwise it builds. The others poll. The builder refreshes
the lock's modification time while it works, so a waiter on any host can tell a dead builder
(lock not refreshed for `stale_after_s`) from a slow one and take over. A builder that fails
removes its lock, and the next process tries again (and reports its own error).

    prepare_once(Path("data/synthetic"), lambda: make_sample_videos(Path("data/synthetic")), "sample clips")
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from training.base.files import unique_temporary

MARKER_NAME = ".prepared"


STARTED_NAME = ".prepare-started"


def lock_path(folder: Path) -> Path:
    """Beside the folder, so it exists before the folder does."""
    folder = Path(folder)
    return folder.with_name(f".{folder.name}.prepare.lock")


def is_prepared(folder: Path) -> bool:
    return (Path(folder) / MARKER_NAME).is_file()


def mark_prepared(folder: Path) -> None:
    """The completion marker, written last; builders that are also called directly (tests, CLIs) call it too."""
    marker = Path(folder) / MARKER_NAME
    temporary = unique_temporary(marker)
    temporary.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "finished": time.time()}))
    temporary.replace(marker)


def _try_lock(lock: Path) -> bool:
    try:
        descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}, handle)
    return True


def _holder(lock: Path) -> dict:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return {}  # being written right now, or just removed


def _dead_on_this_host(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _break_lock(lock: Path, judged: dict) -> None:
    """Moves a dead builder's lock aside. When two waiters race, one rename wins and the other finds
    nothing; a live lock taken by mistake is put back. (Builds write whole files under unique
    names, so even two builders at once would only waste time.)"""
    aside = unique_temporary(lock)
    try:
        lock.rename(aside)
    except FileNotFoundError:
        return
    if _holder(aside) != judged:
        try:
            os.link(aside, lock)
        except OSError:
            pass
    aside.unlink(missing_ok=True)


class _Heartbeat:
    """Touches the lock every `interval_s` while the build runs."""

    def __init__(self, lock: Path, interval_s: float):
        self.lock, self.interval_s, self.done = lock, interval_s, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(self.interval_s):
            try:
                os.utime(self.lock)
            except OSError:
                return

    def __enter__(self) -> "_Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def prepare_once(folder: Path, build: Callable[[], object], what: str, stale_after_s: float = 120.0,
                 poll_s: float = 0.5, log: Callable[[str], None] = print) -> bool:
    """Runs `build` (which fills `folder`) unless `folder` is prepared or is a folder of the user's;
    returns True when this process built it. Waits, without a time limit, for a live builder elsewhere."""
    folder = Path(folder)
    marker, lock = folder / MARKER_NAME, lock_path(folder)
    last_seen, last_change, last_report = None, time.monotonic(), time.monotonic()
    while not marker.is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        if _try_lock(lock):
            try:
                if marker.is_file():  # finished between our check and our lock
                    return False
                if folder.is_dir() and not (folder / STARTED_NAME).is_file():
                    return False  # the user's own folder: read it, never write into it
                log(f"preparing {what} in {folder} (other processes wait for it)")
                folder.mkdir(exist_ok=True)
                (folder / STARTED_NAME).touch()
                with _Heartbeat(lock, interval_s=max(stale_after_s / 8, 0.05)):
                    build()
                mark_prepared(folder)
                return True
            finally:
                lock.unlink(missing_ok=True)
        try:
            modified = lock.stat().st_mtime
        except FileNotFoundError:
            continue  # released: the marker is there, or the builder failed and we try next
        now = time.monotonic()
        if modified != last_seen:  # measured with this host's clock only: no skew between nodes
            last_seen, last_change = modified, now
        holder = _holder(lock)
        if _dead_on_this_host(holder) or now - last_change > stale_after_s:
            log(f"{what}: the process preparing {folder} ({holder.get('host', '?')} pid {holder.get('pid', '?')}) "
                "is gone; taking over")
            _break_lock(lock, holder)
            continue
        if now - last_report > 30:
            log(f"waiting for {holder.get('host', '?')} pid {holder.get('pid', '?')} to finish preparing {what} in {folder}")
            last_report = now
        time.sleep(poll_s)
    return False
