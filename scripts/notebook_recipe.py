"""The published notebook's recipe, as the benchmarks that compare with it rebuild it: its shape,
and upstream's own files (madebyollin/seraena's TAEHV_Training_Example.ipynb, with madebyollin/taehv's
taehv.py and madebyollin/seraena's seraena.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

BATCH, FRAMES, SIZE, GROUP = 16, 12, 64, 3  # the notebook's batch, frames, crop and Seraena frame group
OUR_FRAMES = 9  # Wan's 4k+1 frames with the notebook's 3 latent frames (scripts/benchmark_notebook.py)


def import_file(path: Path):
    """A module from one upstream file (taehv.py, seraena.py)."""
    spec = importlib.util.spec_from_file_location(f"upstream_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upstream_files(taehv_dir: Path | None = None, seraena_dir: Path | None = None) -> tuple[Path, Path]:
    """upstream's taehv.py and seraena.py: the folders given, else TAEHV_UPSTREAM_DIR and SERAENA_UPSTREAM_DIR,
    else ../taehv and ../seraena."""
    taehv_dir = taehv_dir or Path(os.environ.get("TAEHV_UPSTREAM_DIR", "../taehv"))
    seraena_dir = seraena_dir or Path(os.environ.get("SERAENA_UPSTREAM_DIR", "../seraena"))
    return taehv_dir / "taehv.py", seraena_dir / "seraena.py"
