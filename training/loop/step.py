"""One micro-step, in three phases: compute locally, agree, apply (train_step reads as their table
of contents). No collective runs in the first phase; the second is the step's one small all-reduce
(training/base/agreement.py); the third runs the step's collectives only when every rank is fine.
Inside a DDP accumulation window a micro-step runs no collective at all: its flags wait for the
window's end, so an optimizer step reads the device once whatever its accumulation."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from training.base.agreement import agree
from training.base.failures import is_memory_error
from training.base.unwrap import unwrap
from training.data.clips import DataFailureError
from training.loop.recovery import TrainingStopped, drop_gradients, note_bad_step, step_out_of_memory
from training.loop.state import TrainingRun
from training.run.checkpoint_files import complete_checkpoints
from training.loop.skips import STEP_SKIPS, WINDOW_POISONING
from training.config.terms import discriminator_updates
from training.step.losses import (
    StepLosses,
    add_seraena_term,
    at_step_scale,
    forward_losses,
    generators_kept,
    halve,
    halved_at,
    shape_twin,
    warm_late_terms,
    warm_scale,
)


@dataclass
class LocalResult:
    """What one rank's forward left for the agreement: its losses (None when it failed) and its
    failures as data, device flags included (read only by the agreement's one table)."""

    losses: StepLosses | None = None
    lost_batch: bool = False
    out_of_memory: bool = False
    reference_failed: "bool | torch.Tensor" = False


@dataclass
class WindowFault:
    """A micro-step inside a DDP accumulation window as its rank left it: its flags (those of
    STEP_SKIPS, device tensors unread) wait for the window's end, whose agreement reads them."""

    micro_step: int
    flags: dict
    logged: dict | None = None  # its logged terms; emptied when its window's gradients are dropped


@dataclass
class Window:
    """Where the micro-step sits in its accumulation window."""

    ends: bool  # the optimizer steps after this micro-step
    ddp_accumulates: bool  # DDP inside the window: the forward and backward run under no_sync


def train_step(run: TrainingRun, batch) -> tuple[dict | None, str, str]:
    """One micro-step in three phases: compute locally (the forward and losses on this rank alone,
    failures kept as data), agree (the one small all-reduce: every rank takes the same decision),
    apply (Seraena's term, the backward and the optimizer, whose collectives every rank now
    enters; or the skip). The backward belongs to apply, not to the local phase: it reduces
    gradients (every micro-step under ZeRO, a window's last under DDP). Returns (detached logged
    terms, "", "") or (None, reason, "on rank R")."""
    window = accumulation_window(run)
    local = compute_locally(run, batch, window)
    if window.ddp_accumulates:  # no collective in this micro-step: no rank waits on another's decision
        return inside_window(run, local, window)
    skip = agree_on(run, local)
    if skip is not None:
        return None, *skip
    return apply(run, local, window)


def accumulation_window(run: TrainingRun) -> Window:
    # Forward and the decision come before accumulate(): a skipped micro-step must not advance
    # accelerate's accumulation counter, or it would drift from DeepSpeed's. DDP decides in the
    # forward whether the backward all-reduces, so a micro-step inside the accumulation window runs
    # its forward under no_sync (accumulate() predicts the same; DeepSpeed reduces its own way).
    accelerator = run.accelerator
    ends = (accelerator.step + 1) % accelerator.gradient_accumulation_steps == 0
    return Window(ends, accelerator.state.deepspeed_plugin is None and not ends)


def compute_locally(run: TrainingRun, batch, window: Window) -> LocalResult:
    """The forward and losses on this rank; an out-of-memory error becomes a flag, not a raise."""
    accelerator, model = run.accelerator, run.model
    local = LocalResult(lost_batch=batch is None)  # None: a data worker died and took its batch
    with accelerator.no_sync(model) if window.ddp_accumulates else contextlib.nullcontext():
        try:
            if not local.lost_batch:
                video = batch["video"].to(accelerator.device, non_blocking=True).float() / 255  # N,T,3,H,W in [0, 1]
                if not run.late_terms_warmed:  # before this step's forward: none of its activations are live yet
                    warm_other_scales(run, video)
                video = at_step_scale(run.config, video, run.progress.step + 1)
                # finiteness of the reference latents as a device flag for the agreement (no wait here)
                reference_latents = reference_latents_for(run, batch, video, check=False)
                if reference_latents is not None:
                    local.reference_failed = ~torch.isfinite(reference_latents).all()
                # the fp32 video is every term's target; the student casts its own input (Student.forward)
                local.losses = forward_losses(run.config, model, video, reference_latents, run.lpips, step=run.progress.step)
                if not run.late_terms_warmed:  # this process's first micro-step: the shapes of terms that start later too
                    warmed = warm_late_terms(run.config, local.losses, video, reference_latents, run.seraena, run.lpips)
                    run.late_terms_warmed = True
                    if warmed:
                        run.log.line(f"terms that start later ran once at their shapes (cuDNN tunes them now, not mid-run): {', '.join(warmed)}")
        except RuntimeError as error:  # torch.OutOfMemoryError, or cuDNN's and cuBLAS's own allocation failures
            if not is_memory_error(error):
                raise
            local.out_of_memory = True
    if local.out_of_memory:  # outside the except block, so the failed graph is already released
        local.losses = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return local


def warm_other_scales(run: TrainingRun, video: torch.Tensor) -> None:
    """cuDNN's tuning (cudnn.benchmark) of the scale of the clips that later steps train on and the
    first does not (half_size_every: the pooled steps, or the full size when the first step is a
    pooled one), in this process's first micro-step, on a twin of the student (losses.shape_twin) in
    the step's precision: else the first such step would tune every convolution of the student, its
    terms and Seraena mid-run. `video`: this micro-step's clips at full size."""
    config, first = run.config, run.progress.step + 1
    if not config.half_size_every or not torch.backends.cudnn.benchmark:
        return
    later = {halved_at(config, step) for step in range(first + 1, min(config.max_steps, first + config.half_size_every) + 1)}
    for halved in later - {halved_at(config, first)}:
        with generators_kept(video.device):  # the twin's initialisation draws nothing of the run's
            twin = shape_twin(unwrap(run.accelerator, run.model))
            with run.accelerator.autocast():  # what accelerate wraps the student's forward in (bf16 under DDP)
                warm_scale(config, twin, halve(video) if halved else video, run.seraena, run.lpips)
        run.log.line(f"the {'pooled' if halved else 'full-size'} clips of half_size_every={config.half_size_every} "
                     f"ran once on a twin of the student (cuDNN tunes them now, not mid-run)")


def step_flags(local: LocalResult) -> dict:
    """The micro-step's flags of STEP_SKIPS by name (device flags stay on the device)."""
    losses = local.losses
    return {"worker": local.lost_batch, "oom": local.out_of_memory, "reference": local.reference_failed,
            "nonfinite": losses.nonfinite() if losses is not None else False}


def inside_window(run: TrainingRun, local: LocalResult, window: Window) -> tuple[dict | None, str, str]:
    """A micro-step inside a DDP accumulation window (its backward under no_sync, Seraena's
    discriminator still): its flags join the window's, agreed at the window's end (agree_on), so
    these micro-steps read nothing from the device. A rank whose forward failed (out of memory, a
    lost batch) leaves the micro-step out of its own gradients; a non-finite loss or reference has
    reached that rank's gradients by the end, so every rank then drops the window so far."""
    fault = WindowFault(run.progress.micro_step, step_flags(local))
    run.window_faults.append(fault)
    if local.losses is None:
        with run.accelerator.accumulate(run.model):  # accelerate's window counter moves alike on every rank
            pass
        return None, "", ""
    logged, reason, where = apply(run, local, window)
    fault.logged = logged
    return logged, reason, where


def agree_on(run: TrainingRun, local: LocalResult) -> tuple[str, str] | None:
    """Every rank's flags in one all-reduce, with those of the accumulation window's earlier
    micro-steps (inside_window). Stops the run together (lost storage, a full /dev/shm, broken data)
    by raising; returns (reason, where) when every rank skips; None to apply."""
    accelerator, config = run.accelerator, run.config
    earlier, run.window_faults = run.window_faults, []
    flags = {f"{name}@{fault.micro_step}": value for fault in earlier for name, value in fault.flags.items()}
    agreed = agree(accelerator, **step_flags(local), **flags,
                   data=bool(run.failures.problem()), stop=run.stop.requested, backward_oom=bool(run.backward_oom_at),
                   storage=bool(run.storage_down), shm=bool(run.shared_memory_full))
    run.stop.agreed = agreed.any("stop")
    if any(accelerator.process_index in ranks for name, ranks in agreed.items() if name.partition("@")[0] == "reference"):
        run.last_reference_error = (run.reference_vae.nonfinite_message() if run.reference_vae is not None else
                                    f"non-finite latents in latent_cache={config.latent_cache}: rebuild it with scripts/cache_latents.py")
    if agreed.any("storage"):  # the store is down past storage_retry_s: waiting longer is the user's call
        raise TrainingStopped(f"no data from object storage {agreed.where('storage')}: {run.storage_down or 'that rank says why'}; "
                              f"{last_checkpoint(run)}: --resume latest continues once the store answers")
    if agreed.any("shm"):  # a data worker ran out of /dev/shm: the next batches would not fit either
        raise TrainingStopped(f"data loader out of shared memory {agreed.where('shm')}: {run.shared_memory_full or 'that rank says why'}; "
                              f"{last_checkpoint(run)}: --resume latest continues once /dev/shm is larger")
    if agreed.any("data"):  # the same message on every rank; the rank that counted them names the files
        if run.failures.problem():
            print(f"rank {accelerator.process_index}: {run.failures.problem()}", file=sys.stderr, flush=True)
        raise DataFailureError(f"too many clip draws failed {agreed.where('data')} (max_failed_fraction="
                               f"{config.max_failed_fraction}); that rank's error output names the files and reasons")
    if earlier:
        report_window(run, agreed, earlier)
    if agreed.any("backward_oom"):  # a rank's backward ran out of memory in the last micro-steps:
        drop_gradients(run)  # every rank drops the accumulation window so far
        run.backward_oom_at = 0
        return "oom", f"{agreed.where('backward_oom')} (in a backward before this micro-step; its accumulated gradients dropped)"
    for reason in STEP_SKIPS:
        if agreed.any(reason.name):
            return reason.name, agreed.where(reason.name)
    return None


def report_window(run: TrainingRun, agreed, earlier: list[WindowFault]) -> None:
    """The faults of the window's earlier micro-steps, now agreed, in their order; a non-finite loss or
    reference latents on any rank drop the window's gradients so far on every rank (this micro-step
    then goes on alone), and their terms leave the log."""
    dropped = False
    for fault in earlier:
        raised = [reason.name for reason in STEP_SKIPS if agreed.any(f"{reason.name}@{fault.micro_step}")]
        if not raised:
            continue
        poisoned = any(name in WINDOW_POISONING for name in raised)
        dropped |= poisoned
        first = raised[0]  # the first explains the others (STEP_SKIPS's order)
        note_bad_step(run, first, agreed.where(f"{first}@{fault.micro_step}"), micro_step=fault.micro_step,
                      outcome="skipped on all ranks, with its accumulation window so far" if poisoned else
                      "left out of the accumulation window by that rank alone")
    if dropped:
        drop_gradients(run)
        for fault in earlier:
            if fault.logged:
                fault.logged.clear()


def last_checkpoint(run: TrainingRun) -> str:
    latest = complete_checkpoints(run.run_dir)
    return f"the last checkpoint is {latest[-1].name if latest else 'none'}"


def apply(run: TrainingRun, local: LocalResult, window: Window) -> tuple[dict | None, str, str]:
    """Every rank is here: Seraena's term (its all-reduces match), the backward and the optimizer.
    An out-of-memory error here is recovered where no other rank waits on it, else the run stops
    (training/loop/recovery.py step_out_of_memory)."""
    accelerator, config, model = run.accelerator, run.config, run.model
    losses, out_of_memory = local.losses, False
    with accelerator.accumulate(model):
        if accelerator.sync_gradients != window.ends:  # the forward's no_sync would have been wrong: ranks would drift
            raise RuntimeError(f"accelerate's accumulation counter disagrees with the predicted window end at micro-step "
                               f"{run.progress.micro_step}; report this with the accelerate version")
        phase, began = "Seraena step", []
        try:
            # its discriminator steps once per optimizer step, from its start (training/config/terms.py)
            update = accelerator.sync_gradients and discriminator_updates(config, run.progress.step)
            last_layer = unwrap(accelerator, model).last_layer  # None unless adaptive_adversarial
            loss = add_seraena_term(config, run.seraena, losses, update_discriminator=update, last_layer=last_layer)
            phase = "backward"
            loss.register_hook(lambda grad: began.append(True))  # autograd reached the loss: the backward began
            accelerator.backward(loss)
        except RuntimeError as error:
            if not is_memory_error(error):
                raise
            out_of_memory = True
        if out_of_memory:  # outside the except block, so the failed graph is released with these
            loss = losses = local.losses = None
            seraena_reduces = phase != "backward" and accelerator.sync_gradients  # its discriminator update all-reduces
            return step_out_of_memory(run, phase, reducing=seraena_reduces or not window.ddp_accumulates,
                                      backward_ran=bool(began))
        logged = losses.logged
        if accelerator.sync_gradients and accelerator.state.deepspeed_plugin is None:
            norm = gradient_norm(accelerator, list(model.parameters()), config.max_grad_norm).detach().float()
            logged["grad_norm"] = norm
            # a finite loss can still give a non-finite gradient (a bf16 backward that overflows): the fused
            # AdamW then skips its update on the device (step counts included), as DeepSpeed's overflow
            # check does under ZeRO, without reading the norm on the host. The norm is reduced: every rank skips.
            run.optimizer.optimizer.found_inf = (~torch.isfinite(norm)).float()
        run.optimizer.step()
        if accelerator.sync_gradients:
            run.scheduler.step()
            norm = model.get_global_grad_norm() if hasattr(model, "get_global_grad_norm") else None
            if norm is not None:  # DeepSpeed clips inside its step and reports the norm here (read when logged)
                logged["grad_norm"] = norm.detach().float() if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))
        run.optimizer.zero_grad(set_to_none=True)
    return logged, "", ""


def gradient_norm(accelerator, parameters: list, max_norm: float) -> torch.Tensor:
    """The gradients' total norm (a device tensor), after clipping them to max_norm; max_norm=0 is no
    clipping, as DeepSpeed reads gradient_clipping=0 (clip_grad_norm_ would scale every gradient by 0:
    no step would learn). The norm is computed either way: the finiteness check reads it."""
    if max_norm:
        return accelerator.clip_grad_norm_(parameters, max_norm)
    accelerator.unscale_gradients()  # what clip_grad_norm_ does first (fp16's loss scale)
    return torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])


def reference_latents_for(run: TrainingRun, item: dict, video: torch.Tensor, check: bool = True) -> torch.Tensor | None:
    """From the latent cache when the batch carries them, else the reference VAE; None in autoencoder
    mode. check=False: the caller tests finiteness itself (ReferenceVAE.encode)."""
    if "latents" in item:  # stored in bf16 or fp16: the targets are fp32
        latents = item["latents"].to(video.device, non_blocking=True).float()
        return latents.reshape(video.shape[0], *item["latents"].shape[-4:])
    return run.reference_vae.encode(video, check=check) if run.reference_vae is not None else None
