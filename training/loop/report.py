"""The training line and TensorBoard scalars of one log interval.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from training.base.run_log import memory_gb

if TYPE_CHECKING:
    from training.loop.state import TrainingRun


def log_due(config, step: int) -> bool:
    """Whether optimizer step `step` ends a log interval (the last step always does)."""
    return step % config.log_every == 0 or step == config.max_steps


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


class CompileTime:
    """With compile or ref_vae_compile, the first micro-step's time (it compiles) against the next
    ones', said once in train.log at the first log step that has both. Host times around train_step,
    whose agreement waits for the forward anyway: no sync, no collective is added."""

    def __init__(self, run: TrainingRun):
        config, reference = run.config, run.reference_vae
        parts = ["student"] * config.compile + ["reference encode"] * bool(getattr(reference, "compiled_encode", None))
        self.what = f"{' and '.join(parts)}, backend {config.compile_backend}" if parts else ""
        self.times: list[float] = []

    def add(self, seconds: float) -> None:
        if self.what:
            self.times.append(seconds)

    def report(self, log) -> None:
        if not self.what or len(self.times) < 2:
            return
        first, later = self.times[0], self.times[1:]
        log.line(f"compile ({self.what}): first micro-step {first:.1f} s (compiling), then {sum(later) / len(later):.2f} s "
                 f"(mean of the next {len(later)}); compiled artefacts in {os.environ.get('TORCHINDUCTOR_CACHE_DIR')}")
        self.what = ""  # once


def skip_counts(accelerator, failures) -> dict:
    """Skipped clip draws by reason, summed over ranks (cumulative)."""
    from training.data.clips import SKIP_REASONS

    local = torch.tensor([float(failures.counts[r]) for r in SKIP_REASONS], device=accelerator.device)
    total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
    return {f"data/skipped_{reason}": value for reason, value in zip(SKIP_REASONS, total.tolist())}
