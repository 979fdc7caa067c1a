"""One micro-step: compute locally, agree, apply.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from training.base.agreement import agree
from training.base.failures import is_memory_error
from training.data.clips import DataFailureError
from training.loop.build import model_dtype
from training.loop.recovery import TrainingStopped, drop_gradients, step_out_of_memory
from training.loop.state import TrainingRun
from training.run.checkpoint_files import complete_checkpoints
from training.step.losses import add_seraena_term, forward_losses


def train_step(run: "TrainingRun", batch) -> tuple[dict | None, str, str]:
    """One micro-step: the forward on this rank alone, one agreement among all ranks
    (training/base/agreement.py), then, only when every rank is fine, the step's collectives (Seraena's
    discriminator update, backward with the gradient all-reduce, the optimizer). A fault on any
    rank skips the micro-step on every rank together. Returns (detached logged terms, "", "") or
    (None, reason, "on rank R")."""
    config, accelerator, model = run.config, run.accelerator, run.model
    micro_step = run.progress.micro_step
    losses, out_of_memory, reference_failed, lost_batch = None, False, False, batch is None
    # Forward and the decision come before accumulate(): a skipped micro-step must not advance
    # accelerate's accumulation counter, or it would drift from DeepSpeed's. DDP decides in the
    # forward whether the backward all-reduces, so a micro-step inside the accumulation window runs
    # its forward under no_sync (accumulate() predicts the same; DeepSpeed reduces its own way).
    window_ends = (accelerator.step + 1) % accelerator.gradient_accumulation_steps == 0
    ddp_accumulates = accelerator.state.deepspeed_plugin is None and not window_ends
    student = accelerator.unwrap_model(model)
    with accelerator.no_sync(model) if ddp_accumulates else contextlib.nullcontext():
        try:
            if not lost_batch:
                video = batch["video"].to(accelerator.device, non_blocking=True).float() / 255  # N,T,3,H,W in [0, 1]
            # finiteness of the reference latents as a device flag for the agreement (no wait here)
            reference_latents = None if lost_batch else reference_latents_for(run, batch, video, check=False)
            if reference_latents is not None:
                reference_failed = ~torch.isfinite(reference_latents).all()
            if not lost_batch:
                with run.faults.in_forward(student, micro_step):
                    losses = forward_losses(config, model, video.to(model_dtype(model)), reference_latents, run.lpips)
            if micro_step in run.faults.oom_micro_steps:  # as late in the forward as a real one can come
                run.faults.raise_out_of_memory(accelerator.device, micro_step)
        except RuntimeError as error:  # torch.OutOfMemoryError, or cuDNN's and cuBLAS's own allocation failures
            if not is_memory_error(error):
                raise
            out_of_memory = True
    if out_of_memory:  # outside the except block, so the failed graph is already released
        losses = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    elif losses is not None and micro_step in run.faults.nonfinite_micro_steps:
        losses.total = losses.total * float("nan")
    if run.progress.step + 1 == run.faults.stop_at_step:
        run.stop.requested = True
    if micro_step == run.faults.data_failure_micro_step:
        run.failures.update([("decode_error", "(injected)")] * (run.failures.min_draws + run.failures.draws), 0)
    agreed = agree(accelerator, worker=lost_batch, oom=out_of_memory, nonfinite=losses.nonfinite() if losses is not None else False,
                   reference=reference_failed, data=bool(run.failures.problem()), stop=run.stop.requested,
                   backward_oom=bool(run.backward_oom_at), storage=bool(run.storage_down), shm=bool(run.shared_memory_full))
    run.stop.agreed = agreed.any("stop")
    if accelerator.process_index in agreed.get("reference", []):
        run.last_reference_error = (run.reference_vae.nonfinite_message() if run.reference_vae is not None else
                                    f"non-finite latents in latent_cache={config.latent_cache}: rebuild it with scripts/cache_latents.py")
    if agreed.any("storage"):  # the store is down past storage_retry_s: waiting longer is the user's call
        latest = complete_checkpoints(run.run_dir)
        raise TrainingStopped(f"no data from object storage {agreed.where('storage')}: {run.storage_down or 'that rank says why'}; "
                              f"the last checkpoint is {latest[-1].name if latest else 'none'}: --resume latest continues "
                              "once the store answers")
    if agreed.any("shm"):  # a data worker ran out of /dev/shm: the next batches would not fit either
        latest = complete_checkpoints(run.run_dir)
        raise TrainingStopped(f"data loader out of shared memory {agreed.where('shm')}: {run.shared_memory_full or 'that rank says why'}; "
                              f"the last checkpoint is {latest[-1].name if latest else 'none'}: --resume latest continues "
                              "once /dev/shm is larger")
    if agreed.any("data"):  # the same message on every rank; the rank that counted them names the files
        if run.failures.problem():
            print(f"rank {accelerator.process_index}: {run.failures.problem()}", file=sys.stderr, flush=True)
        raise DataFailureError(f"too many clip draws failed {agreed.where('data')} (max_failed_fraction="
                               f"{config.max_failed_fraction}); that rank's error output names the files and reasons")
    if agreed.any("backward_oom"):  # a rank's backward ran out of memory in the last micro-steps:
        drop_gradients(run)  # every rank drops the accumulation window so far
        run.backward_oom_at = 0
        return None, "oom", f"{agreed.where('backward_oom')} (in a backward before this micro-step; its accumulated gradients dropped)"
    for reason in ("worker", "oom", "reference", "nonfinite"):
        if agreed.any(reason):
            return None, reason, agreed.where(reason)
    with accelerator.accumulate(model):
        if accelerator.sync_gradients != window_ends:  # the forward's no_sync would have been wrong: ranks would drift
            raise RuntimeError(f"accelerate's accumulation counter disagrees with the predicted window end at micro-step "
                               f"{micro_step}; report this with the accelerate version")
        phase, backward_ran = "Seraena step", False
        try:
            # every rank is here, so Seraena's all-reduces match; its discriminator steps once per optimizer step
            with run.faults.in_seraena(run.seraena, micro_step):
                loss = add_seraena_term(config, run.seraena, losses, update_discriminator=accelerator.sync_gradients)
            phase = "backward"
            with run.faults.in_backward(student, micro_step):
                backward_ran = True
                accelerator.backward(loss)
        except RuntimeError as error:
            if not is_memory_error(error):
                raise
            out_of_memory = True
        if out_of_memory:  # outside the except block, so the failed graph is released with these
            loss = losses = None
            seraena_reduces = phase != "backward" and accelerator.sync_gradients  # its discriminator update all-reduces
            return step_out_of_memory(run, phase, reducing=seraena_reduces or not ddp_accumulates, backward_ran=backward_ran)
        logged = losses.logged
        if accelerator.sync_gradients and accelerator.state.deepspeed_plugin is None:
            logged["grad_norm"] = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm).detach().float()
        run.optimizer.step()
        if accelerator.sync_gradients:
            run.scheduler.step()
            norm = model.get_global_grad_norm() if hasattr(model, "get_global_grad_norm") else None
            if norm is not None:  # DeepSpeed clips inside its step and reports the norm here (read when logged)
                logged["grad_norm"] = norm.detach().float() if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))
        run.optimizer.zero_grad(set_to_none=True)
    return logged, "", ""


def reference_latents_for(run: TrainingRun, item: dict, video: torch.Tensor, check: bool = True) -> torch.Tensor | None:
    """From the latent cache when the batch carries them, else the reference VAE; None in autoencoder
    mode. check=False: the caller tests finiteness itself (ReferenceVAE.encode)."""
    if "latents" in item:
        return item["latents"].to(video.device, non_blocking=True).reshape(video.shape[0], *item["latents"].shape[-4:])
    return run.reference_vae.encode(video, check=check) if run.reference_vae is not None else None
