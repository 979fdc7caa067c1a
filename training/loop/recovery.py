"""What the loop does when a step goes wrong: skipped steps and their advice, an out-of-memory
backward, stopping after too many bad steps."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

from training.base.failures import set_collective_timeout
from training.base.unwrap import unwrap
from training.loop.checkpoints import save_checkpoint
from training.loop.skips import SKIPS
from training.run.checkpoint_files import complete_checkpoints

if TYPE_CHECKING:
    from training.loop.state import TrainingRun


class TrainingStopped(RuntimeError):
    """Too many bad steps in a row: a checkpoint was written and the run stops."""


class StoppedInsideACollective(TrainingStopped):
    """A stop that left this rank's collectives (DDP's reducer, DeepSpeed's buckets) half-way."""


def note_bad_step(run: TrainingRun, reason: str, where: str, micro_step: int = 0,
                  outcome: str = "skipped on all ranks") -> None:
    """Count a skipped step by reason (micro_step: an earlier one of the accumulation window, agreed
    at its end); too many in a row: checkpoint and stop with advice."""
    run.skipped_steps[reason] += 1
    run.consecutive_bad_steps += 1
    skip = SKIPS[reason]
    run.accelerator.log({f"train/skipped_{reason}_steps": run.skipped_steps[reason]}, step=run.progress.step)
    run.log.line(f"{skip.what} {where} at micro-step {micro_step or run.progress.micro_step} (step {run.progress.step + 1}): "
                 f"{outcome} ({run.skipped_steps[reason]} so far, {run.consecutive_bad_steps} in a row)")
    if run.last_reference_error:
        print(f"rank {run.accelerator.process_index}: {run.last_reference_error}", file=sys.stderr, flush=True)
        run.last_reference_error = ""
    if run.consecutive_bad_steps > run.config.max_consecutive_bad_steps:
        saved = save_checkpoint(run, run.progress.step)
        raise TrainingStopped(
            f"{run.consecutive_bad_steps} {skip.kind} steps in a row "
            f"(max_consecutive_bad_steps={run.config.max_consecutive_bad_steps}); checkpoint {saved}. {skip.advice}")


def drop_gradients(run: TrainingRun) -> None:
    """Clears the student's gradients for real: accelerate's optimizer wrapper clears them only at a
    window's end (and not at all under DeepSpeed), so a dropped window would leak into the next step."""
    for parameter in unwrap(run.accelerator, run.model).parameters():
        parameter.grad = None


def step_out_of_memory(run: TrainingRun, phase: str, reducing: bool, backward_ran: bool) -> tuple[None, str, str]:
    """An out-of-memory error in this rank's step phase (`phase`: Seraena's discriminator step or
    the backward). Where no other rank waits on it (one process, or a DDP backward inside an
    accumulation window, under no_sync) every rank drops the window's gradients at the next
    agreement and the micro-step counts as skipped. Where other ranks are inside a collective of
    it (Seraena's all-reduce, the gradient all-reduce of a window's end, every DeepSpeed backward),
    where a DDP backward that reduces stopped half-way (its reducer cannot be reset), or under
    DeepSpeed at all (its buffers hold partial gradients that no public call clears, and
    its micro-step counter would drift from accelerate's), the step cannot be undone: stop with the
    advice and the last checkpoint; the other ranks stop as the collective breaks."""
    accelerator = run.accelerator
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    deepspeed = accelerator.state.deepspeed_plugin is not None
    others_wait = accelerator.num_processes > 1 and reducing
    # a DDP backward that reduces and stopped half-way leaves DDP's reducer mid-reduction: the next
    # forward would fail, and nothing public resets it
    reducer_broken = reducing and backward_ran and isinstance(run.model, torch.nn.parallel.DistributedDataParallel)
    if others_wait or reducer_broken or deepspeed:
        latest = complete_checkpoints(run.run_dir)
        why = ("the other ranks are inside its collectives" if others_wait
               else "DeepSpeed keeps partial gradients and its own micro-step count" if deepspeed
               else "DDP's gradient reducer is left mid-reduction")
        raise StoppedInsideACollective(
            f"out of memory in the {phase} of micro-step {run.progress.micro_step} on rank {accelerator.process_index}: "
            f"{why}, so this step cannot be skipped; the job stops. {SKIPS['oom'].advice}, then --resume latest "
            f"(last checkpoint: {latest[-1].name if latest else 'none'})")
    drop_gradients(run)
    run.backward_oom_at = run.progress.micro_step
    return None, "", ""  # not a skip yet: every rank counts it together at the next agreement


def shorten_collective_timeout(run: TrainingRun) -> None:
    """After the first step, collectives get step_timeout_s instead of the long set-up timeout
    (nccl_timeout_s, which covers loading, compiling and the first step): a rank that stops
    answering ends the job in minutes, not hours."""
    run.step_timeout_set = True
    if run.accelerator.num_processes > 1:
        set_collective_timeout(run.config.step_timeout_s)
