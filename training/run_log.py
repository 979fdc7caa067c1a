"""What a run reports while it trains: the plain log (stdout and <run>/train.log), TensorBoard
scalars per log interval, and an optional torch.profiler trace."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from training.training_run import TrainingRun


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


def log_training(run: TrainingRun, window: list[dict], elapsed: float, data_wait: float) -> None:
    """One sync point per log interval: TensorBoard scalars and the plain log line."""
    config, accelerator, step = run.config, run.accelerator, run.progress.step
    keys = sorted(set().union(*window))
    # the window's scalars stayed on the device; one host copy for all of them here
    means = torch.stack([torch.stack([torch.as_tensor(w[k], device=accelerator.device).float() for w in window if k in w]).mean()
                         for k in keys]).tolist()
    scalars = {f"train/{k}": value for k, value in zip(keys, means)}
    scalars.update({
        "train/lr": run.scheduler.get_last_lr()[0],
        "train/samples_per_second": len(window) * config.batch_size_per_gpu * accelerator.num_processes / elapsed,
        "train/data_wait_fraction": data_wait / elapsed,
        "train/peak_memory_gb": memory_gb(accelerator.device),
    })
    scalars.update(skip_counts(accelerator, run.failures))
    accelerator.log(scalars, step=step)
    memory = "GPU" if accelerator.device.type == "cuda" else "RSS"  # peak allocated on the GPU, peak resident on the host
    run.log.line(f"Step {step}/{config.max_steps} | Loss: {scalars['train/loss']:.4f} | "
                 f"PSNR: {scalars.get('train/psnr', float('nan')):.2f} dB | {memory}: {scalars['train/peak_memory_gb']:.1f}GB | "
                 f"{len(window) / config.gradient_accumulation_steps / elapsed:.2f} steps/sec")


def skip_counts(accelerator, failures) -> dict:
    """Skipped clip draws by reason, summed over ranks (cumulative)."""
    from training.dataset import SKIP_REASONS

    local = torch.tensor([float(failures.counts[r]) for r in SKIP_REASONS], device=accelerator.device)
    total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
    return {f"data/skipped_{reason}": value for reason, value in zip(SKIP_REASONS, total.tolist())}


def memory_gb(device) -> float:
    """Peak memory in GB of 1e9 bytes, the unit of training/memory.py's estimate and gpu_memory_gb.
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

