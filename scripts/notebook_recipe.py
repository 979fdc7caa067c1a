"""The published notebook's recipe, as the benchmarks that compare with it rebuild it: its shape,
and upstream's own files (madebyollin/seraena's TAEHV_Training_Example.ipynb, with madebyollin/taehv's
taehv.py and madebyollin/seraena's seraena.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BATCH, FRAMES, SIZE, GROUP = 16, 12, 64, 3  # the notebook's batch, frames, crop and Seraena frame group
OUR_FRAMES = 9  # Wan's 4k+1 frames with the notebook's 3 latent frames (scripts/benchmark_notebook.py)


def import_file(path: Path):
    """A module from one upstream file (taehv.py, seraena.py)."""
    spec = importlib.util.spec_from_file_location(f"upstream_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
