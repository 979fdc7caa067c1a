"""Seams: named points where a phase of the run lets something installed once at build time act.

The checkpoint save, the validation record and the final export fire their seam by name
(`seams.fire("file_write", what, step)`); with nothing installed, firing does nothing. Only fault
injection for tests and soak runs installs hooks today (training/loop/fault_injection.py), so
none of those phases reads an injection setting or knows a fault exists. The step itself has no
seam: its faults are hooks on the modules, where real ones come from.

Seams of the run (name: arguments, where it fires):
  file_write: (what, step) before rank 0 writes `what` (history, best_model, final)
  checkpoint_probe: (probe_path, step) inside each rank's write probe of a checkpoint folder
  checkpoint_write: (path, step) before this rank writes one file of a checkpoint (after every
    collective of the save: a failing write leaves no other rank waiting)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

SEAM_NAMES = ("file_write", "checkpoint_probe", "checkpoint_write")


class Seams:
    def __init__(self):
        self._hooks: dict[str, list[Callable]] = defaultdict(list)

    def install(self, name: str, hook: Callable) -> None:
        if name not in SEAM_NAMES:  # a typo would install a hook that never fires
            raise ValueError(f"no seam named {name!r}; the seams are {', '.join(SEAM_NAMES)}")
        self._hooks[name].append(hook)

    def fire(self, name: str, *args) -> None:
        for hook in self._hooks.get(name, ()):
            hook(*args)
