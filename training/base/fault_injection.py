"""Fault injection for tests and soak runs, read once from the environment and installed at build time.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import torch


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
