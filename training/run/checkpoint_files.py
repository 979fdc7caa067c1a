"""Reading a checkpoint folder: the one reader of its named states (resume,
scripts/convert_checkpoint.py, inference.py)."""

from __future__ import annotations

from pathlib import Path


def read_state(folder: Path, name: str, present: list[str] | None = None) -> dict | None:
    """The state called `name` in a checkpoint folder, or None. The one reader of checkpoint
    state (resume, scripts/convert_checkpoint.py, inference.py). Checkpoints written before the
    names hold accelerate's custom_checkpoint_<i>.pkl, numbered in STATE_NAMES order among the
    parts that run had: given `present` (a resuming run has the same parts), else recognised by
    content (only the EMA can be)."""
    import torch  # here, not at the top: the launcher's config step reads run folders and never a state (~2.7 s a launch)

    path = folder / f"{name}_state.pt"
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=False)
    if present is not None:
        legacy = folder / f"custom_checkpoint_{present.index(name)}.pkl" if name in present else None
        return torch.load(legacy, map_location="cpu", weights_only=False) if legacy and legacy.is_file() else None
    if name == "ema":
        for legacy in sorted(folder.glob("custom_checkpoint_*.pkl")):
            state = torch.load(legacy, map_location="cpu", weights_only=False)
            if isinstance(state, dict) and "shadow" in state:
                return state
    return None


def is_checkpoint_folder(folder: Path) -> bool:
    return any(folder.glob("*_state.pt")) or any(folder.glob("custom_checkpoint_*.pkl"))


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders that were moved into place, oldest first (temporary ones never count)."""
    folders = [p for p in (run_dir / "checkpoints").glob("checkpoint-*") if p.is_dir() and p.name.split("-")[1].isdigit()]
    return sorted(folders, key=lambda p: int(p.name.split("-")[1]))
