"""The published notebook's recipe, as the benchmarks that compare with it rebuild it: its shape,
and upstream's own files (madebyollin/seraena's TAEHV_Training_Example.ipynb, with madebyollin/taehv's
taehv.py and madebyollin/seraena's seraena.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path

import torch
import torch.nn.functional as F

BATCH, FRAMES, SIZE, GROUP = 16, 12, 64, 3  # the notebook's batch, frames, crop and Seraena frame group
OUR_FRAMES = 9  # Wan's 4k+1 frames with the notebook's 3 latent frames (scripts/benchmark_notebook.py)


def import_file(path: Path):
    """A module from one upstream file (taehv.py, seraena.py)."""
    spec = importlib.util.spec_from_file_location(f"upstream_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upstream_files(taehv_dir: Path | None = None, seraena_dir: Path | None = None) -> tuple[Path, Path]:
    """upstream's taehv.py and seraena.py: the folders given, else TAEHV_UPSTREAM_DIR and SERAENA_UPSTREAM_DIR,
    else ../taehv and ../seraena."""
    taehv_dir = taehv_dir or Path(os.environ.get("TAEHV_UPSTREAM_DIR", "../taehv"))
    seraena_dir = seraena_dir or Path(os.environ.get("SERAENA_UPSTREAM_DIR", "../seraena"))
    return taehv_dir / "taehv.py", seraena_dir / "seraena.py"


def no_part(name: str):
    return contextlib.nullcontext()


def notebook_train_step(taehv_dir: Path, seraena_dir: Path, device: torch.device, size: int = SIZE, reference=None,
                        amp_dtype: torch.dtype | None = None, average: bool = False, part=no_part):
    """The notebook's Trainer.train_step as upstream's code runs it, on fixed random clips of BATCH x
    FRAMES x size x size. `reference`: a diffusers Wan VAE (bf16) that encodes the clips each step as
    the notebook's RefVAE.encode_video does, else fixed random latents; `amp_dtype`: the student's
    autocast with a GradScaler (the notebook's fp16 on CUDA); `average`: its AveragedModel updated each
    step. `part(name)` marks each part of the step (scripts/host_cost.py counts them)."""
    TAEHV = import_file(taehv_dir / "taehv.py").TAEHV
    Seraena = import_file(seraena_dir / "seraena.py").Seraena
    torch.manual_seed(0)
    model = TAEHV(checkpoint_path=None).to(device).train()
    seraena = Seraena(3 * GROUP, model.latent_channels).to(device)
    # the notebook's AdamW, in CUDA's default implementation (foreach) on every device
    optimizer = torch.optim.AdamW(model.parameters(), 3e-4, betas=(0.9, 0.95), foreach=True)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype is not None)
    weights = lambda w_prev, w_new, n: min(0.95, n / 10) * w_prev + (1 - min(0.95, n / 10)) * w_new  # noqa: E731
    averaged = torch.optim.swa_utils.AveragedModel(model, avg_fn=weights) if average else None
    clips = (torch.rand(BATCH, FRAMES, 3, size, size, device=device) * 255).to(torch.uint8)
    fixed_latents = torch.randn(BATCH, FRAMES // 4, model.latent_channels, size // 8, size // 8, device=device)
    trim = model.frames_to_trim
    autocast = lambda: torch.autocast(device.type, amp_dtype, enabled=amp_dtype is not None)  # noqa: E731

    def group(x):  # the notebook's pad_and_group: back to FRAMES frames, then GROUP frames per image
        x = torch.cat([x, x[:, :trim]], 1)
        return x.reshape(-1, GROUP * x.shape[2], *x.shape[3:])

    def encode(ims):  # the notebook's RefVAE.encode_video
        x = ims.transpose(1, 2)
        return reference.encode(x.to(torch.bfloat16).mul(2).sub_(1)).latent_dist.sample().transpose(1, 2).to(x.dtype)

    def step():
        with part("reference_encode"), torch.no_grad():
            ims = clips.float().div_(255.0)
            latent = encode(ims).float() if reference is not None else fixed_latents
        with part("student_forward"), autocast():
            encoded = model.encode_video(ims, parallel=True, show_progress_bar=False)
        with part("losses"), autocast():
            losses = [F.mse_loss(encoded, latent)]
        target_frames = ims[:, :-trim]
        decoder_grad = torch.zeros_like(target_frames).requires_grad_(True)  # the notebook's probe of the decoder's gradient
        with part("student_forward"), autocast():
            decoded = model.decode_video(latent, parallel=True, show_progress_bar=False) + decoder_grad
        with part("seraena"):
            context = latent.mean(1, keepdim=True).repeat_interleave(FRAMES // GROUP, dim=1).flatten(0, 1)
            target, _ = seraena.step_and_make_correction_targets(group(target_frames), group(decoded), context)
            target = target.reshape(-1, FRAMES, 3, size, size)[:, :-trim].reshape(decoded.shape)
        with part("losses"), autocast():
            losses += [F.mse_loss(decoded, target_frames), F.mse_loss(decoded, target)]
        with part("optimizer"):
            optimizer.zero_grad()
        with part("backward"):
            scaler.scale(sum(losses)).backward()
        with part("optimizer"):
            scaler.step(optimizer)
            scaler.update()
        if averaged is not None:
            with part("ema"):
                averaged.update_parameters(model)

    return step
