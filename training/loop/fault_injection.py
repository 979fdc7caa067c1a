"""Fault injection for tests and soak runs: read once from the environment, installed once at
build time where real faults come from (hooks on the student's and Seraena's modules, inside
autograd, inside DeepSpeed's save, in a data worker) or on a phase's seam (training/base/seams.py).
The step, data, checkpoint and validation code never read these settings.

    TAEHV_FAULT_NONFINITE_MICRO_STEPS=3,4   the student's outputs of those micro-steps (batches,
                                            counted from 1 over the whole run) are NaN
    TAEHV_FAULT_OOM_MICRO_STEPS=3,4         out of memory at the end of their forward
    TAEHV_FAULT_REAL_OOM=1                  ... a real one on CUDA (an allocation no GPU can serve)
    TAEHV_FAULT_CUDNN_ERROR_MICRO_STEPS=3   cuDNN's allocation failure (a RuntimeError) inside the
                                            student's first convolution
    TAEHV_FAULT_SERAENA_OOM_MICRO_STEPS=3   out of memory inside Seraena's discriminator forward
    TAEHV_FAULT_NONFINITE_REFERENCE_CLIP=<clip>
                                            the reference VAE's latents of that validation clip
                                            (its path under data_root) are NaN wherever it is
                                            encoded, as a bf16 overflow on its content would be
    TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS=3  out of memory as their backward starts, or with
    TAEHV_FAULT_OOM_IN_AUTOGRAD=1           ... from inside autograd (a gradient hook on the
                                            student's first trained weight, the last one the
                                            backward reaches: the other gradients are written)
    TAEHV_FAULT_NONFINITE_GRADIENT_MICRO_STEPS=3  a finite loss whose backward gives one parameter an
                                            infinite gradient at micro-step 3 (the update is skipped)
    TAEHV_FAULT_STOP_AT_STEP=N              a real SIGTERM to this process during step N
    TAEHV_FAULT_DATA_FAILURE_MICRO_STEP=N   enough failed clip draws at micro-step N to pass
                                            max_failed_fraction
    TAEHV_FAULT_WORKER_SEGFAULT=<marker>    the first data worker to reach its second sample while
                                            the marker does not exist creates it and dies by SIGSEGV
    TAEHV_FAULT_CHECKPOINT_FAIL_STEPS=2     the checkpoint of step 2 fails its write probe (after a
                                            partial file)
    TAEHV_FAULT_STATE_SAVE_FAIL_STEPS=2     this rank's first file write of that checkpoint fails after a
                                            partial file (rank 0: the full state; others: their own files)
    TAEHV_FAULT_SLOW_SAVE_S=N               each checkpoint's writes take N s longer
    TAEHV_FAULT_WRITE_FAILS=history,best_model,final
                                            rank 0's first write of each named file fails once
    TAEHV_FAULT_RANK=R                      all of the above on rank R only (unset: every rank)
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import torch
from torch.utils.data import Dataset

from training.base.unwrap import unwrap


def _numbers(name: str) -> set[int]:
    return {int(x) for x in os.environ.get(name, "").split(",") if x.strip()}


def once(steps: set[int], now: int) -> bool:
    """Whether `now` is one of `steps`, each answering yes once (a fault fires at its first chance)."""
    if now in steps:
        steps.discard(now)
        return True
    return False


def _number(name: str, kind=int):
    return kind(os.environ.get(name, "0") or 0)


@dataclass
class FaultInjection:
    nonfinite_micro_steps: set[int] = field(default_factory=set)
    nonfinite_gradient_micro_steps: set[int] = field(default_factory=set)
    oom_micro_steps: set[int] = field(default_factory=set)
    real_oom: bool = False
    cudnn_error_micro_steps: set[int] = field(default_factory=set)
    seraena_oom_micro_steps: set[int] = field(default_factory=set)
    nonfinite_reference_clip: str = ""
    backward_oom_micro_steps: set[int] = field(default_factory=set)
    oom_in_autograd: bool = False
    stop_at_step: int = 0
    data_failure_micro_step: int = 0
    worker_segfault_marker: str = ""
    checkpoint_fail_steps: set[int] = field(default_factory=set)
    state_save_fail_steps: set[int] = field(default_factory=set)
    slow_save_s: float = 0.0
    failing_writes: set[str] = field(default_factory=set)

    @classmethod
    def from_environment(cls) -> "FaultInjection":
        only_rank = os.environ.get("TAEHV_FAULT_RANK", "").strip()
        if only_rank and int(only_rank) != int(os.environ.get("RANK", "0")):
            return cls()
        return cls(
            nonfinite_micro_steps=_numbers("TAEHV_FAULT_NONFINITE_MICRO_STEPS"),
            nonfinite_gradient_micro_steps=_numbers("TAEHV_FAULT_NONFINITE_GRADIENT_MICRO_STEPS"),
            oom_micro_steps=_numbers("TAEHV_FAULT_OOM_MICRO_STEPS"),
            real_oom=os.environ.get("TAEHV_FAULT_REAL_OOM", "") == "1",
            cudnn_error_micro_steps=_numbers("TAEHV_FAULT_CUDNN_ERROR_MICRO_STEPS"),
            seraena_oom_micro_steps=_numbers("TAEHV_FAULT_SERAENA_OOM_MICRO_STEPS"),
            nonfinite_reference_clip=os.environ.get("TAEHV_FAULT_NONFINITE_REFERENCE_CLIP", "").strip(),
            backward_oom_micro_steps=_numbers("TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS"),
            oom_in_autograd=os.environ.get("TAEHV_FAULT_OOM_IN_AUTOGRAD", "") == "1",
            stop_at_step=_number("TAEHV_FAULT_STOP_AT_STEP"),
            data_failure_micro_step=_number("TAEHV_FAULT_DATA_FAILURE_MICRO_STEP"),
            worker_segfault_marker=os.environ.get("TAEHV_FAULT_WORKER_SEGFAULT", ""),
            checkpoint_fail_steps=_numbers("TAEHV_FAULT_CHECKPOINT_FAIL_STEPS"),
            state_save_fail_steps=_numbers("TAEHV_FAULT_STATE_SAVE_FAIL_STEPS"),
            slow_save_s=_number("TAEHV_FAULT_SLOW_SAVE_S", float),
            failing_writes={x.strip() for x in os.environ.get("TAEHV_FAULT_WRITE_FAILS", "").split(",") if x.strip()},
        )

    def wrap_dataset(self, dataset: Dataset) -> Dataset:
        """The training dataset as the loader's workers see it (before any worker exists)."""
        return SegfaultingDataset(dataset, self.worker_segfault_marker) if self.worker_segfault_marker else dataset

    def install(self, run) -> None:
        """Hooks for every configured fault, on the built run (training/loop/state.py TrainingRun).
        Each step fault fires once, at the first call of its micro-step (the training forward comes
        before validation, and a recomputing backward after it)."""
        progress = run.progress
        student = unwrap(run.accelerator, run.model)

        def out_of_memory(where: str):
            if self.real_oom and run.accelerator.device.type == "cuda":
                torch.empty(1 << 50, dtype=torch.uint8, device=run.accelerator.device)  # the allocator's own error
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected {where} at micro-step {progress.micro_step})")

        def before_forward(module, inputs):
            if progress.step + 1 == self.stop_at_step:
                self.stop_at_step = 0
                os.kill(os.getpid(), signal.SIGTERM)  # the run's own handler (training/base/failures.py StopRequest)
            if progress.micro_step == self.data_failure_micro_step:
                self.data_failure_micro_step = 0
                run.failures.update([("decode_error", "(injected)")] * (run.failures.min_draws + run.failures.draws), 0)

        def after_forward(module, inputs, outputs):
            if once(self.oom_micro_steps, progress.micro_step):  # as late in the forward as a real one can come
                out_of_memory("in the forward")
            if once(self.nonfinite_micro_steps, progress.micro_step):
                return {name: value * float("nan") for name, value in outputs.items()}
            return None

        # only the hooks a fault needs: a run without faults keeps a hook-free forward (torch.compile)
        if self.stop_at_step or self.data_failure_micro_step:
            student.register_forward_pre_hook(before_forward)
        if self.oom_micro_steps or self.nonfinite_micro_steps:
            student.register_forward_hook(after_forward)
        if self.cudnn_error_micro_steps:
            # inside a compiled forward (compile=true): left out of the graph, whose guards would
            # otherwise test the micro-step counter the hook reads and recompile at every micro-step
            @torch.compiler.disable
            def cudnn_failure(module, inputs):
                if once(self.cudnn_error_micro_steps, progress.micro_step):
                    raise RuntimeError(f"cuDNN error: CUDNN_STATUS_ALLOC_FAILED (injected at micro-step {progress.micro_step})")

            next(m for m in student.modules() if isinstance(m, torch.nn.Conv2d)).register_forward_pre_hook(cudnn_failure)
        if self.seraena_oom_micro_steps and run.seraena is not None:
            def seraena_failure(module, inputs):
                if once(self.seraena_oom_micro_steps, progress.micro_step):
                    out_of_memory("in Seraena")

            discriminator_conv = next(m for m in run.seraena.seraena.modules() if isinstance(m, torch.nn.Conv2d))
            discriminator_conv.register_forward_pre_hook(seraena_failure)
        if self.backward_oom_micro_steps:
            self._install_backward_failure(run, student, out_of_memory)
        if self.nonfinite_gradient_micro_steps:
            def overflowing_gradient(grad):  # a finite loss whose bf16 backward overflows in one layer
                if once(self.nonfinite_gradient_micro_steps, run.progress.micro_step):
                    return grad * float("inf")
                return grad

            next(p for p in student.parameters() if p.requires_grad).register_hook(overflowing_gradient)
        if self.nonfinite_reference_clip:
            self._install_reference_overflow(run)
        self._install_save_faults(run)

    def _install_backward_failure(self, run, student, out_of_memory) -> None:
        if self.oom_in_autograd:
            def in_autograd(grad):
                if once(self.backward_oom_micro_steps, run.progress.micro_step):
                    out_of_memory("in the backward")

            next(p for p in student.parameters() if p.requires_grad).register_hook(in_autograd)
            return
        backward = run.accelerator.backward

        def backward_that_fails(loss, **kwargs):  # an instance attribute over accelerate's method
            if once(self.backward_oom_micro_steps, run.progress.micro_step):
                out_of_memory("as the backward starts")
            return backward(loss, **kwargs)

        run.accelerator.backward = backward_that_fails

    def _install_reference_overflow(self, run) -> None:
        """The reference VAE's encode (an instance attribute over its method) returns NaN latents for
        the rows that hold the named validation clip, as validation hands it over (fp32 in [0, 1])."""
        dataset, name, reference = run.validation_dataset, self.nonfinite_reference_clip, run.reference_vae
        names = [dataset.index.relative(i) for i in range(len(dataset))] if hasattr(dataset, "index") else []
        if reference is None or name not in names:
            raise ValueError(f"TAEHV_FAULT_NONFINITE_REFERENCE_CLIP={name}: needs the reference VAE (use_ref_vae=true, no "
                             f"latent_cache) and one of the validation clips: {', '.join(names) or 'none'}")
        clip = dataset[names.index(name)]["video"].float() / 255
        encode = reference.encode

        def encode_that_overflows(video, generator=None, check=True):
            latents = encode(video, generator, check=False)
            if video.shape[1:] == clip.shape:
                hit = (video == clip.to(video.device)).flatten(1).all(1)
                latents = torch.where(hit.view(-1, 1, 1, 1, 1), float("nan"), latents)
            if check and not torch.isfinite(latents).all():  # the check the real encode makes
                raise FloatingPointError(reference.nonfinite_message())
            return latents

        reference.encode = encode_that_overflows

    def _install_save_faults(self, run) -> None:
        if self.failing_writes:
            def fail_write(what: str, step: int):
                if what in self.failing_writes:
                    self.failing_writes.discard(what)
                    raise OSError(28, f"No space left on device (injected: {what} at step {step})")

            run.seams.install("file_write", fail_write)
        if self.checkpoint_fail_steps:
            def fail_probe(probe, step: int):
                if step in self.checkpoint_fail_steps:
                    probe.write_bytes(b"\0" * 1024)  # a partial file, as a disk that fills mid-write leaves
                    raise OSError(28, "No space left on device (injected)")

            run.seams.install("checkpoint_probe", fail_probe)
        if self.slow_save_s or self.state_save_fail_steps:
            slowed: set[int] = set()

            def slow_or_failing_write(path, step: int):
                if self.slow_save_s and step not in slowed:  # storage that takes its time, once per checkpoint
                    slowed.add(step)
                    time.sleep(self.slow_save_s)
                if once(self.state_save_fail_steps, step):  # a disk that fills in the middle of the checkpoint
                    path.write_bytes(b"\0" * 1024)
                    raise OSError(28, f"No space left on device (injected: {path.name} of the checkpoint of step {step})")

            run.seams.install("checkpoint_write", slow_or_failing_write)


class SegfaultingDataset(Dataset):
    """The training dataset whose first worker to reach its second sample, while `marker` does not
    exist, creates it and dies by SIGSEGV, as a decoder crashing on one file among millions would."""

    def __init__(self, dataset: Dataset, marker: str):
        self.dataset, self.marker, self.samples = dataset, marker, 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if torch.utils.data.get_worker_info() is not None:
            self.samples += 1  # per worker process: each has its own copy
            if self.samples == 2:
                try:
                    os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
                    os.kill(os.getpid(), signal.SIGSEGV)
                except FileExistsError:
                    pass
        return self.dataset[key]
