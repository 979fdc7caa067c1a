"""Whole-file writes: a temporary name unique per host, process and thread, renamed into place, so
a reader never sees half a file and two writers never share a temporary."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path


def unique_temporary(path: Path) -> Path:
    """A hidden sibling name no other process uses and no video scanner picks up (no video suffix)."""
    return path.with_name(f".{path.name}.{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}.tmp")


def write_json(path: Path, value: dict) -> Path:
    """Whole-file write: a reader never sees half of it."""
    temporary = unique_temporary(path)
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    temporary.replace(path)
    return path
