"""Faults: what a run does when something goes wrong, and how tests inject it.

Skipped steps and their advice, an out-of-memory backward, stop requests (SIGTERM/SIGINT), the
collective timeout after the first step, and ranks that die with their launcher. Every decision
that more than one rank must take together goes through training/agreement.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import torch

from training.checkpoints import complete_checkpoints, save_checkpoint
from training.shared_memory import SharedMemoryFull, shared_memory_stop
from training.storage import StorageUnavailable

if TYPE_CHECKING:
    from training.training_run import TrainingRun


@dataclass
class FaultInjection:
    """For tests and soak runs, read once from the environment:
    TAEHV_FAULT_NONFINITE_MICRO_STEPS=3,4 makes the loss of those micro-steps (batches, counted
    from 1 over the whole run) NaN; TAEHV_FAULT_OOM_MICRO_STEPS=3,4 raises an out-of-memory error
    in their forward; TAEHV_FAULT_CHECKPOINT_FAIL_STEPS=2 makes the checkpoint of step 2 fail to
    write (after a partial file); TAEHV_FAULT_STOP_AT_STEP=N acts as a SIGTERM during step N;
    TAEHV_FAULT_DATA_FAILURE_MICRO_STEP=N counts enough failed clip draws at micro-step N to pass
    max_failed_fraction; TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS=3 raises an out-of-memory error as
    their backward starts, or, with TAEHV_FAULT_OOM_IN_AUTOGRAD=1, from inside autograd (a
    gradient hook on the student's first trained weight, the last one the backward reaches: the
    other gradients of that micro-step are written by then, as with a real one);
    TAEHV_FAULT_SERAENA_OOM_MICRO_STEPS=3 raises one inside Seraena's discriminator forward;
    TAEHV_FAULT_CUDNN_ERROR_MICRO_STEPS=3 raises cuDNN's allocation failure (a RuntimeError) inside
    the student's first convolution; TAEHV_FAULT_ENGINE_SAVE_FAIL_STEPS=2 fails DeepSpeed's first
    file write of the checkpoint of step 2, inside the engine; TAEHV_FAULT_WRITE_FAILS=history,
    best_model,final fails rank 0's first write of each named file once (a full disk);
    TAEHV_FAULT_SLOW_SAVE_S=N makes each checkpoint's writes take N s longer (slow storage).
    TAEHV_FAULT_RANK=R limits all of them to rank R (unset: every
    rank). TAEHV_FAULT_REAL_OOM=1 makes the forward's out-of-memory errors real ones on CUDA (an
    allocation no GPU can serve), for tests/test_gpu.py."""

    nonfinite_micro_steps: set[int] = field(default_factory=set)
    oom_micro_steps: set[int] = field(default_factory=set)
    checkpoint_fail_steps: set[int] = field(default_factory=set)
    stop_at_step: int = 0
    data_failure_micro_step: int = 0
    backward_oom_micro_steps: set[int] = field(default_factory=set)
    real_oom: bool = False
    oom_in_autograd: bool = False
    seraena_oom_micro_steps: set[int] = field(default_factory=set)
    cudnn_error_micro_steps: set[int] = field(default_factory=set)
    engine_save_fail_steps: set[int] = field(default_factory=set)
    failing_writes: set[str] = field(default_factory=set)
    slow_save_s: float = 0.0

    def raise_out_of_memory(self, device: torch.device, micro_step: int) -> None:
        if self.real_oom and device.type == "cuda":
            torch.empty(1 << 50, dtype=torch.uint8, device=device)  # 1 PiB: the CUDA caching allocator's own error
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected at micro-step {micro_step})")

    @contextlib.contextmanager
    def in_forward(self, student, micro_step: int):
        """The student's forward, with cuDNN's allocation failure raised inside its first convolution."""
        handle = None
        if micro_step in self.cudnn_error_micro_steps:
            def fail(module, inputs):
                raise RuntimeError(f"cuDNN error: CUDNN_STATUS_ALLOC_FAILED (injected at micro-step {micro_step})")

            first_conv = next(m for m in student.modules() if isinstance(m, torch.nn.Conv2d))
            handle = first_conv.register_forward_pre_hook(fail)
        try:
            yield
        finally:
            if handle is not None:
                handle.remove()

    def fail_write(self, what: str, step: int) -> None:
        if what in self.failing_writes:
            self.failing_writes.discard(what)
            raise OSError(28, f"No space left on device (injected: {what} at step {step})")

    @contextlib.contextmanager
    def in_engine_save(self, engine, step: int):
        """DeepSpeed's checkpoint save, with this rank's first file write inside the engine failing
        (TAEHV_FAULT_ENGINE_SAVE_FAIL_STEPS): a disk that fills after the write probe passed."""
        checkpoint_engine = getattr(engine, "checkpoint_engine", None)
        if step not in self.engine_save_fail_steps or checkpoint_engine is None:
            yield
            return

        def fail(*args, **kwargs):
            raise OSError(28, f"No space left on device (injected inside DeepSpeed's save of step {step})")

        checkpoint_engine.save = fail  # an instance attribute over the class's method
        try:
            yield
        finally:
            del checkpoint_engine.save  # the class's method again

    @contextlib.contextmanager
    def in_seraena(self, seraena, micro_step: int):
        """Seraena's step, with an out-of-memory error raised inside its discriminator's forward."""
        handle = None
        if seraena is not None and micro_step in self.seraena_oom_micro_steps:
            def fail(module, inputs):
                raise torch.OutOfMemoryError(f"CUDA out of memory (injected in Seraena at micro-step {micro_step})")

            discriminator_conv = next(m for m in seraena.seraena.modules() if isinstance(m, torch.nn.Conv2d))
            handle = discriminator_conv.register_forward_pre_hook(fail)
        try:
            yield
        finally:
            if handle is not None:
                handle.remove()

    @contextlib.contextmanager
    def in_backward(self, student, micro_step: int):
        """The backward, with an out-of-memory error raised before it starts or from inside autograd."""
        handle = None
        if micro_step in self.backward_oom_micro_steps:
            def fail(grad):
                raise torch.OutOfMemoryError(f"CUDA out of memory (injected in the backward of micro-step {micro_step})")

            if not self.oom_in_autograd:
                fail(None)
            first_trained = next(p for p in student.parameters() if p.requires_grad)
            handle = first_trained.register_hook(fail)
        try:
            yield
        finally:
            if handle is not None:
                handle.remove()

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
                   numbers("TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS"), os.environ.get("TAEHV_FAULT_REAL_OOM", "") == "1",
                   os.environ.get("TAEHV_FAULT_OOM_IN_AUTOGRAD", "") == "1", numbers("TAEHV_FAULT_SERAENA_OOM_MICRO_STEPS"),
                   numbers("TAEHV_FAULT_CUDNN_ERROR_MICRO_STEPS"), numbers("TAEHV_FAULT_ENGINE_SAVE_FAIL_STEPS"),
                   {x.strip() for x in os.environ.get("TAEHV_FAULT_WRITE_FAILS", "").split(",") if x.strip()},
                   float(os.environ.get("TAEHV_FAULT_SLOW_SAVE_S", "0") or 0))


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


class StoppedInsideACollective(TrainingStopped):
    """A stop that left this rank's collectives (DDP's reducer, DeepSpeed's buckets) half-way."""


ADVICE = {
    "nonfinite": ("non-finite loss", "Lower learning_rate, check the data (python -m training.dataset ...) "
                  "or resume from an earlier checkpoint"),
    "oom": ("out of memory", "Lower batch_size_per_gpu (raise gradient_accumulation_steps to keep the global "
            "batch), n_frames or height/width, or set gradient_checkpointing=true"),
    "reference": ("non-finite reference latents", "Check the reference VAE weights and precision (ref_vae_path), "
                  "or the clips of those batches"),
    "worker": ("a data worker died (its batch lost)", "A decoder crashed on a file (its rank's error output has the "
               "signal); check the data (python -m training.dataset ...) and remove the file from the index"),
}


def loader_batches(run: TrainingRun):
    """The loader's batches from the sampler's position to the end of the epoch. A data worker that
    dies (a decoder segfault on one bad file among millions) costs one batch, not the rank: None
    comes in its place (train_step skips it on every rank, so micro-steps stay aligned), and a new
    loader iterator starts after it. Each death is counted as failed draws of the whole batch. A
    worker out of shared memory (SharedMemoryFull, or killed by SIGBUS) is no bad file: the rank
    sets run.shared_memory_full and every rank stops together (train_step)."""
    while True:
        if run.loader.num_workers > 0:
            # torch's SIGCHLD handler would raise the worker's death at whatever line the main
            # process is on (inside a collective, a backward); without it the next fetch raises it
            from torch.utils.data._utils import signal_handling

            signal_handling._SIGCHLD_handler_set = True
        iterator = None
        try:
            iterator = iter(run.loader)
            for batch in iterator:
                yield batch
            return
        except StorageUnavailable as error:  # past storage_retry_s: every rank stops together (train_step)
            # from a loader worker the message is torch's report, ending with "...StorageUnavailable: <ours>"
            run.storage_down = str(error).strip().splitlines()[-1].split("StorageUnavailable: ", 1)[-1]
            print(f"rank {run.accelerator.process_index}: {run.storage_down}", file=sys.stderr, flush=True)
        except SharedMemoryFull as error:  # the next batches would not fit either: every rank stops together (train_step)
            cause = str(error).strip().splitlines()[-1].split("SharedMemoryFull: ", 1)[-1]
            run.shared_memory_full = shared_memory_stop(run.config, cause, local_processes())
        except RuntimeError as error:
            if "DataLoader worker" not in str(error):
                raise
            if killed_by_bus_error(iterator):  # not a bad file: a full /dev/shm ends a worker this way
                latent_shard = ", or reading a latent cache shard truncated on disk" if run.config.latent_cache else ""
                run.shared_memory_full = shared_memory_stop(
                    run.config, f"a data worker was killed by SIGBUS (a bus error: how a process dies writing into a full "
                                f"/dev/shm{latent_shard})", local_processes())
            else:
                print(f"rank {run.accelerator.process_index}: {error}; its batch is skipped", file=sys.stderr, flush=True)
                run.failures.update([("worker_died", str(error))] * run.config.batch_size_per_gpu, 0)
            run.loader._iterator = None  # persistent workers: the broken iterator must not be reused
        yield None
        run.sampler.set_position(*divmod(run.progress.micro_step, run.sampler.batches_per_epoch))


def killed_by_bus_error(iterator) -> bool:
    """Whether a worker of this loader iterator died of SIGBUS (torch's own message then says only
    'exited unexpectedly', since loader_batches turns its SIGCHLD handler off)."""
    import signal

    return any(worker.exitcode == -signal.SIGBUS for worker in getattr(iterator, "_workers", []))


def local_processes() -> int | None:
    """Processes on this node (torchrun's LOCAL_WORLD_SIZE), None outside a launch."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None


KIND = {"nonfinite": "non-finite", "oom": "out-of-memory", "reference": "reference-VAE-failure", "worker": "lost-batch"}


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


# RuntimeErrors that mean the device ran out of memory: cuDNN and cuBLAS report a failed allocation
# as their own status, not as torch.OutOfMemoryError
MEMORY_ERRORS = ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED", "CUDA error: out of memory")


def is_memory_error(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and any(marker in str(error) for marker in MEMORY_ERRORS))


def drop_gradients(run: TrainingRun) -> None:
    """Clears the student's gradients for real: accelerate's optimizer wrapper clears them only at a
    window's end (and not at all under DeepSpeed), so a dropped window would leak into the next step."""
    for parameter in run.accelerator.unwrap_model(run.model).parameters():
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
            f"{why}, so this step cannot be skipped; the job stops. {ADVICE['oom'][1]}, then --resume latest "
            f"(last checkpoint: {latest[-1].name if latest else 'none'})")
    drop_gradients(run)
    run.backward_oom_at = run.progress.micro_step
    return None, "", ""  # not a skip yet: every rank counts it together at the next agreement


def is_peer_gone(error: BaseException) -> bool:
    """A collective that broke because another rank left (it stopped with its own message, or died):
    gloo's transport messages, and NCCL's as torch's DistBackendError carries them (the remote-error
    code, or an internal error whose last error is the socket the peer closed)."""
    text = str(error)
    return isinstance(error, RuntimeError) and any(marker in text for marker in (
        "Connection closed by peer", "Connection closed by remote peer", "Connection reset by peer", "Broken pipe",
        "NCCL communicator was aborted", "remote process exited", "remote process exiting prematurely", "ncclRemoteError"))


def die_with_launcher() -> None:
    """A rank whose agent dies (SIGKILL, the OOM killer) would otherwise train on as an orphan
    beside the restarted job, writing into the same run folder: Linux SIGKILLs it when its parent
    goes. The last checkpoint is the resume point either way."""
    from training.launch import UNDER_AGENT, die_with_parent

    if "LOCAL_RANK" in os.environ or UNDER_AGENT in os.environ:  # torchrun's ranks; our agent's one process
        die_with_parent()


def set_collective_timeout(seconds: float) -> int:
    """The timeout of every process group this rank belongs to: the default one and those DeepSpeed
    made for its gradient reduce-scatter and parameter gathers (created with torch's own default,
    10 minutes on NCCL). Returns how many groups got it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0
    c10d = dist.distributed_c10d
    groups = [group for group in c10d._world.pg_map if not c10d._rank_not_in_group(group)]
    for group in groups:
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)
    return len(groups)


def shorten_collective_timeout(run: TrainingRun) -> None:
    """After the first step, collectives get step_timeout_s instead of the long set-up timeout
    (nccl_timeout_s, which covers loading, compiling and the first step): a rank that stops
    answering ends the job in minutes, not hours."""
    run.step_timeout_set = True
    if run.accelerator.num_processes > 1:
        set_collective_timeout(run.config.step_timeout_s)


def is_collective_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)

