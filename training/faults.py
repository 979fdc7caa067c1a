"""Faults: what a run does when something goes wrong, and how tests inject it.

Skipped steps and their advice, an out-of-memory backward, stop requests (SIGTERM/SIGINT), the
collective timeout after the first step, and ranks that die with their launcher. Every decision
that more than one rank must take together goes through training/agreement.py.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import torch

from training.checkpoints import complete_checkpoints, save_checkpoint

if TYPE_CHECKING:
    from training.taehv_train import TrainingRun


@dataclass
class FaultInjection:
    """For tests and soak runs, read once from the environment:
    TAEHV_FAULT_NONFINITE_MICRO_STEPS=3,4 makes the loss of those micro-steps (batches, counted
    from 1 over the whole run) NaN; TAEHV_FAULT_OOM_MICRO_STEPS=3,4 raises an out-of-memory error
    in their forward; TAEHV_FAULT_CHECKPOINT_FAIL_STEPS=2 makes the checkpoint of step 2 fail to
    write (after a partial file); TAEHV_FAULT_STOP_AT_STEP=N acts as a SIGTERM during step N;
    TAEHV_FAULT_DATA_FAILURE_MICRO_STEP=N counts enough failed clip draws at micro-step N to pass
    max_failed_fraction; TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS=3 raises an out-of-memory error as
    their backward starts. TAEHV_FAULT_RANK=R limits all of them to rank R (unset: every rank).
    TAEHV_FAULT_REAL_OOM=1 makes the forward's out-of-memory errors real ones on CUDA (an
    allocation no GPU can serve), for tests/test_gpu.py."""

    nonfinite_micro_steps: set[int] = field(default_factory=set)
    oom_micro_steps: set[int] = field(default_factory=set)
    checkpoint_fail_steps: set[int] = field(default_factory=set)
    stop_at_step: int = 0
    data_failure_micro_step: int = 0
    backward_oom_micro_steps: set[int] = field(default_factory=set)
    real_oom: bool = False

    def raise_out_of_memory(self, device: torch.device, micro_step: int) -> None:
        if self.real_oom and device.type == "cuda":
            torch.empty(1 << 50, dtype=torch.uint8, device=device)  # 1 PiB: the CUDA caching allocator's own error
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected at micro-step {micro_step})")

    @classmethod
    def from_environment(cls) -> "FaultInjection":
        only_rank = os.environ.get("TAEHV_FAULT_RANK", "").strip()
        if only_rank and int(only_rank) != int(os.environ.get("RANK", "0")):
            return cls()

        def numbers(name: str) -> set[int]:
            return {int(x) for x in os.environ.get(name, "").split(",") if x.strip()}

        return cls(numbers("TAEHV_FAULT_NONFINITE_MICRO_STEPS"), numbers("TAEHV_FAULT_OOM_MICRO_STEPS"),
                   numbers("TAEHV_FAULT_CHECKPOINT_FAIL_STEPS"), int(os.environ.get("TAEHV_FAULT_STOP_AT_STEP", "0") or 0),
                   int(os.environ.get("TAEHV_FAULT_DATA_FAILURE_MICRO_STEP", "0") or 0),
                   numbers("TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS"), os.environ.get("TAEHV_FAULT_REAL_OOM", "") == "1")


class StopRequest:
    """SIGTERM / SIGINT (preemption): finish the current step, checkpoint, exit 0."""

    def __init__(self):
        self.requested = False
        self.agreed = False

    def install(self) -> "StopRequest":
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True


class TrainingStopped(RuntimeError):
    """Too many bad steps in a row: a checkpoint was written and the run stops."""


ADVICE = {
    "nonfinite": ("non-finite loss", "Lower learning_rate, check the data (python -m training.dataset ...) "
                  "or resume from an earlier checkpoint"),
    "oom": ("out of memory", "Lower batch_size_per_gpu (raise gradient_accumulation_steps to keep the global "
            "batch), n_frames or height/width, or set gradient_checkpointing=true"),
    "reference": ("non-finite reference latents", "Check the reference VAE weights and precision (ref_vae_path), "
                  "or the clips of those batches"),
}


KIND = {"nonfinite": "non-finite", "oom": "out-of-memory", "reference": "reference-VAE-failure"}


def note_bad_step(run: TrainingRun, reason: str, where: str) -> None:
    """Count a skipped step by reason; too many in a row: checkpoint and stop with advice."""
    run.skipped_steps[reason] += 1
    run.consecutive_bad_steps += 1
    what, advice = ADVICE[reason]
    run.accelerator.log({f"train/skipped_{reason}_steps": run.skipped_steps[reason]}, step=run.progress.step)
    run.log.line(f"{what} {where} at micro-step {run.progress.micro_step} (step {run.progress.step + 1}): skipped on "
                 f"all ranks ({run.skipped_steps[reason]} so far, {run.consecutive_bad_steps} in a row)")
    if run.last_reference_error:
        print(f"rank {run.accelerator.process_index}: {run.last_reference_error}", file=sys.stderr, flush=True)
        run.last_reference_error = ""
    if run.consecutive_bad_steps > run.config.max_consecutive_bad_steps:
        saved = save_checkpoint(run, run.progress.step)
        raise TrainingStopped(
            f"{run.consecutive_bad_steps} {KIND[reason]} steps in a row "
            f"(max_consecutive_bad_steps={run.config.max_consecutive_bad_steps}); checkpoint {saved}. {advice}")


def backward_out_of_memory(run: TrainingRun, reducing: bool) -> tuple[None, str, str]:
    """An out-of-memory error inside this rank's backward. When that backward does not reduce
    gradients (one process, or DDP inside an accumulation window, under no_sync) every rank drops
    the partial gradients of the window and the next micro-step is counted as skipped. When it
    reduces (DeepSpeed on every micro-step, DDP at the window's end), the other ranks are already
    inside its all-reduce and cannot skip it: stop with advice."""
    accelerator = run.accelerator
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if accelerator.num_processes > 1 and reducing:
        latest = complete_checkpoints(run.run_dir)
        raise TrainingStopped(
            f"out of memory in the backward of micro-step {run.progress.micro_step} on rank {accelerator.process_index}: the "
            f"other ranks are inside the gradient all-reduce, so this step cannot be skipped; the job stops (the other "
            f"ranks within step_timeout_s={run.config.step_timeout_s} s). {ADVICE['oom'][1]}, then --resume latest "
            f"(last checkpoint: {latest[-1].name if latest else 'none'})")
    run.optimizer.zero_grad(set_to_none=True)
    run.backward_oom_at = run.progress.micro_step
    return None, "", ""  # not a skip yet: every rank counts it together at the next agreement


def die_with_launcher() -> None:
    """A rank whose agent dies (SIGKILL, the OOM killer) would otherwise train on as an orphan
    beside the restarted job, writing into the same run folder: Linux SIGKILLs it when its parent
    goes. The last checkpoint is the resume point either way."""
    from training.launch import UNDER_AGENT, die_with_parent

    if "LOCAL_RANK" in os.environ or UNDER_AGENT in os.environ:  # torchrun's ranks; our agent's one process
        die_with_parent()


def shorten_collective_timeout(run: TrainingRun) -> None:
    """After the first step, collectives get step_timeout_s instead of the long set-up timeout
    (nccl_timeout_s, which covers loading, compiling and the first step): a rank that stops
    answering ends the job in minutes, not hours."""
    import torch.distributed as dist

    run.step_timeout_set = True
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=run.config.step_timeout_s))


def is_collective_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)

