"""Reading a checkpoint folder: the one reader of its named states (resume,
scripts/convert_checkpoint.py, inference.py), every file loaded as data only; and what a failed
write of one of its files means.

Every state a checkpoint holds is tensors and plain values (dicts, lists, tuples, numbers,
strings, None), so each file loads with torch.load(weights_only=True): a file that names any
other Python object (one that would run code when loaded) is refused before a resume builds
anything (`unsafe_files`). Checkpoints written before the random states became plain values hold
accelerate's random_states_<rank>.pkl, a NumPy generator state among them: those load with
NumPy's array types allowed (OLD_RANDOM_STATE_NAMES), and nothing else.
"""

from __future__ import annotations

import shutil
from pathlib import Path

RANDOM_STATES = "random_states_{rank}.pt"  # this trainer's, plain values (training/loop/checkpoints.py)
OLD_RANDOM_STATES = "random_states_{rank}.pkl"  # accelerate's save_accelerator_state, before


class CheckpointFileError(ValueError):
    """A checkpoint file that is not data only, or not a file torch.save wrote: one line, the file named."""


def read_state(folder: Path, name: str, present: list[str] | None = None) -> dict | None:
    """The state called `name` in a checkpoint folder, or None. The one reader of checkpoint
    state (resume, scripts/convert_checkpoint.py, inference.py). Checkpoints written before the
    names hold accelerate's custom_checkpoint_<i>.pkl, numbered in STATE_NAMES order among the
    parts that run had: given `present` (a resuming run has the same parts), else recognised by
    content (only the EMA can be)."""
    path = folder / f"{name}_state.pt"
    if path.is_file():
        return load_file(path)
    if present is not None:
        legacy = folder / f"custom_checkpoint_{present.index(name)}.pkl" if name in present else None
        return load_file(legacy) if legacy and legacy.is_file() else None
    if name == "ema":
        for legacy in sorted(folder.glob("custom_checkpoint_*.pkl")):
            state = load_file(legacy)
            if isinstance(state, dict) and "shadow" in state:
                return state
    return None


def load_file(path: Path, map_location="cpu"):
    """One checkpoint file as data (weights_only=True): tensors and plain values, plus NumPy's array
    types in an older random-state file. Raises CheckpointFileError naming the file otherwise."""
    import pickle

    import torch  # here, not at the top: the launcher's config step reads run folders and never a state (~2.7 s a launch)

    try:
        with torch.serialization.safe_globals(old_random_state_globals() if is_old_random_states(path) else []):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointFileError(file_problem(path) or f"{path}: refused: {str(error).splitlines()[0]}") from None


def is_old_random_states(path: Path) -> bool:
    return path.name.startswith("random_states_") and path.suffix == ".pkl"


# what accelerate's random_states_<rank>.pkl names besides tensors: NumPy's legacy generator state
# (an array of uint32), pickled under numpy._core by NumPy 2 and numpy.core by NumPy 1
OLD_RANDOM_STATE_NAMES = {"numpy.ndarray", "numpy.dtype", "numpy.dtypes.UInt32DType",
                          "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct"}


def old_random_state_globals() -> list:
    """OLD_RANDOM_STATE_NAMES as torch.serialization.safe_globals takes them."""
    import numpy

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1
        from numpy.core.multiarray import _reconstruct
    allowed = [numpy.ndarray, numpy.dtype, (_reconstruct, "numpy.core.multiarray._reconstruct"),
               (_reconstruct, "numpy._core.multiarray._reconstruct")]
    uint32 = getattr(getattr(numpy, "dtypes", None), "UInt32DType", None)
    return allowed + ([uint32] if uint32 is not None else [])


def file_problem(path: Path) -> str:
    """'' when a checkpoint file loads as data only, else one line naming it: the Python objects it
    names beyond tensors and plain values (read from its pickle without running it; the NumPy types
    of an older random-state file are allowed), or that torch.save did not write it."""
    import torch

    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError) as error:  # not the zip file torch.save writes
        return f"{path}: refused: not a file torch.save wrote ({str(error).splitlines()[0]}); resume from another checkpoint"
    names = [name for name in names if not (is_old_random_states(path) and name in OLD_RANDOM_STATE_NAMES)]
    if not names:
        return ""
    return (f"{path}: refused: it names {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}, which loading would "
            "import and run (a checkpoint holds tensors and plain values only): it was not written by this trainer "
            "or was altered; resume from another checkpoint")


def unsafe_files(folder: Path) -> list[str]:
    """One line per file a resume reads from `folder` that would run code when loaded (every *.pt
    and *.pkl directly in it; DeepSpeed's and accelerate's own files of older checkpoints are never
    read). Reads only each file's pickle, never its tensors."""
    paths = sorted([*folder.glob("*.pt"), *folder.glob("*.pkl")])
    return [problem for path in paths if path.is_file() and (problem := file_problem(path))]


# what a failed write raises: OSError, or RuntimeError from torch.save (its full disk names no errno)
WRITE_ERRORS = (OSError, RuntimeError)


def describe_write_failure(error: BaseException, path: Path) -> str:
    """One line for a failed checkpoint or export write. torch.save reports a full disk as a
    RuntimeError that names no cause ("[enforce fail at inline_container.cc:672] . unexpected pos
    576 vs 534"), so the space left where it wrote is said beside it."""
    first = (str(error).splitlines() or [type(error).__name__])[0].strip()
    if isinstance(error, OSError) and error.filename is None:
        first = f"{first} ({path})"
    elif not isinstance(error, OSError):
        first = f"writing {path}: {first}"
    try:
        free = shutil.disk_usage(path.parent if path.parent.exists() else path.parent.parent).free
        return f"{first}; {free / 1e6:.1f} MB free there"
    except OSError:
        return first


def is_checkpoint_folder(folder: Path) -> bool:
    return any(folder.glob("*_state.pt")) or any(folder.glob("custom_checkpoint_*.pkl"))


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders that were moved into place, oldest first (temporary ones never count)."""
    folders = [p for p in (run_dir / "checkpoints").glob("checkpoint-*") if p.is_dir() and p.name.split("-")[1].isdigit()]
    return sorted(folders, key=lambda p: int(p.name.split("-")[1]))
