"""What a run reports while it trains: the plain log (stdout and <run>/train.log), TensorBoard
scalars per log interval, and an optional torch.profiler trace."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import torch


class RunLog:
    """Rank 0: plain lines to stdout and <run>/train.log."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.file = open(run_dir / "train.log", "a") if enabled else None

    def line(self, text: str) -> None:
        if self.enabled:
            stamped = f"{datetime.now():%Y-%m-%d %H:%M:%S} {text}"
            print(stamped, flush=True)
            self.file.write(stamped + "\n")
            self.file.flush()


def memory_gb(device) -> float:
    """Peak memory in GB of 1e9 bytes, the unit of training/plan/memory.py's estimate and gpu_memory_gb.
    On CUDA, the peak allocated since the previous log line (the counter is reset here): the first
    interval holds cuDNN's autotuning, which tries algorithms with whatever workspace is free and
    skips those that do not fit, so later intervals show what the training itself needs."""
    import resource

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 1e9
        torch.cuda.reset_peak_memory_stats(device)
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # peak RSS, in kB


def start_profiler(run_dir: Path, rank: int):
    """torch.profiler over steps 2-4 (after one warm-up step); one Chrome trace per rank."""
    folder = run_dir / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(folder / f"trace_rank{rank}.json")),
        record_shapes=True,
    )
    profiler.start()
    return profiler
