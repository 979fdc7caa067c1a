"""What one training step computes: student outputs, the weighted loss terms, Seraena targets,
and the averaged (EMA) weights that are validated and exported.

Loss terms (a weight of 0 skips the computation, not only the sum):
- encoder:        MSE(student encode(video), reference latents)
- decoder:        pixel loss(student decode(reference latents), aligned input frames)
- reconstruction: pixel loss(student decode(student encode(video)), aligned input frames)
- perceptual:     LPIPS(decoded frames, aligned input frames) (models/metrics.py)
- seraena:        MSE(decoded frames, Seraena-corrected targets), frames grouped in threes
The perceptual and Seraena terms look at the decode of reference latents when distilling (what a
diffusion model hands the decoder), else at the round trip.
Decoded frame j shows input frame j (models/reference_vae.py), so "aligned" is the first frames.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from models.metrics import psnr
from models.seraena import Seraena, group_frames, video_context
from models.taehv import TAEHV


class Student(nn.Module):
    """The TAEHV being trained, with one forward for everything a step needs (DeepSpeed engines
    run their bookkeeping in forward). Only the requested outputs are computed."""

    def __init__(self, taehv: TAEHV):
        super().__init__()
        self.taehv = taehv

    def forward(self, video: torch.Tensor, reference_latents: torch.Tensor | None,
                want_latents: bool, want_roundtrip: bool, want_reference_decode: bool) -> dict:
        outputs = {}
        if want_latents or want_roundtrip:
            outputs["latents"] = self.taehv.encode_video(video)
        if want_roundtrip:
            outputs["roundtrip"] = self.taehv.decode_video(outputs["latents"])
        if want_reference_decode:
            outputs["reference_decode"] = self.taehv.decode_video(reference_latents.to(video.dtype))
        return outputs


def pixel_loss(kind: str, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.l1_loss(prediction, target) if kind == "l1" else F.mse_loss(prediction, target)


def aligned(video: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    return video[:, : decoded.shape[1]]


def all_reduce_mean(tensors: list[torch.Tensor]) -> None:
    """In place, across all ranks (no-op in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1).float() for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t).to(t.dtype))
        offset += t.numel()


class SeraenaState:
    """Seraena in a multi-process run: identical initial weights on every rank (seeded), gradients
    and BatchNorm statistics averaged each step, so weights and optimizer stay identical. The
    replay buffer is deliberately per rank (each holds its own fakes); a checkpoint stores rank 0's.
    Registered with accelerate for checkpointing."""

    def __init__(self, latent_channels: int, learning_rate: float, buffer_size: int, seed: int, rank: int,
                 device: torch.device, amp_dtype: torch.dtype | None):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.seraena = Seraena(9, latent_channels, lr=learning_rate, buffer_size=buffer_size,
                                   seed=seed + rank, amp_dtype=amp_dtype)
        self.seraena.to(device)

    def loss(self, real: torch.Tensor, decoded: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Steps the discriminator, then returns MSE(decoded, corrected target) for the student."""
        real_groups = group_frames(aligned(real, decoded)).float()  # under bf16 engines the input video is bf16
        fake_groups = group_frames(decoded)
        if not torch.isfinite(fake_groups).all():  # keep the discriminator clean; the step is skipped anyway
            return fake_groups.float().mean() * float("nan")
        context = video_context(latents.detach().float(), fake_groups.shape[0] // decoded.shape[0])
        self.seraena.discriminator_step(real_groups, fake_groups.detach().float(), context, reduce_gradients=all_reduce_mean)
        all_reduce_mean(self.seraena.batchnorm_buffers())
        target = self.seraena.correct(real_groups, fake_groups.detach().float(), context)
        return F.mse_loss(fake_groups.float(), target)

    def state_dict(self) -> dict:
        return {"weights": self.seraena.state_dict(), "training": self.seraena.training_state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.seraena.load_state_dict(state["weights"])
        self.seraena.load_training_state_dict(state["training"])


def compute_losses(config, student, video: torch.Tensor, reference_latents: torch.Tensor | None,
                   seraena: SeraenaState | None, lpips: nn.Module | None = None) -> tuple[torch.Tensor, dict]:
    """Total weighted loss and the detached terms for logging."""
    distill = reference_latents is not None
    judged = config.seraena_weight > 0 or config.perceptual_weight > 0  # terms that look at "the" decode
    outputs = student(
        video, reference_latents,
        want_latents=distill and config.encoder_weight > 0,
        want_roundtrip=config.reconstruction_weight > 0 or (not distill and judged),
        want_reference_decode=distill and (config.decoder_weight > 0 or judged),
    )
    terms = {}
    if distill and config.encoder_weight > 0:
        terms["encoder"] = (config.encoder_weight, F.mse_loss(outputs["latents"].float(), reference_latents))
    if distill and config.decoder_weight > 0:
        decoded = outputs["reference_decode"].float()
        terms["decoder"] = (config.decoder_weight, pixel_loss(config.pixel_loss, decoded, aligned(video, decoded)))
    if config.reconstruction_weight > 0:
        decoded = outputs["roundtrip"].float()
        terms["reconstruction"] = (config.reconstruction_weight, pixel_loss(config.pixel_loss, decoded, aligned(video, decoded)))
    judged_decode = outputs["reference_decode"] if distill and judged else outputs.get("roundtrip")
    if config.perceptual_weight > 0:
        if lpips is None:
            raise ValueError("perceptual_weight > 0 but no LPIPS model was given (models.metrics.load_lpips)")
        decoded = judged_decode.float()
        terms["perceptual"] = (config.perceptual_weight, lpips(decoded, aligned(video, decoded)).mean())
    if seraena is not None and config.seraena_weight > 0:
        context = reference_latents if distill else outputs["latents"]
        terms["seraena"] = (config.seraena_weight, seraena.loss(video, judged_decode.float(), context))
    total = sum(weight * value for weight, value in terms.values())
    shown = outputs.get("reference_decode", outputs.get("roundtrip"))
    logged = {name: value.detach() for name, (_, value) in terms.items()}
    logged["loss"] = total.detach()
    if shown is not None:  # nothing is decoded when only the encoder term is on
        logged["psnr"] = psnr(shown.detach(), aligned(video, shown)).mean()
    return total, logged


class WeightEMA:
    """fp32 exponential moving average of the student's weights, on every rank. Under ZeRO-3 the
    partitions are gathered for the update. Registered with accelerate for checkpointing."""

    def __init__(self, weights: dict[str, torch.Tensor], decay: float, device: torch.device):
        self.decay = decay
        self.shadow = {k: v.detach().float().to(device).clone() for k, v in weights.items()}

    @torch.no_grad()
    def update(self, module: nn.Module, zero_stage: int) -> None:
        params = dict(module.named_parameters())
        if zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
                self._blend(params)
        else:
            self._blend(params)

    def _blend(self, params: dict) -> None:
        for name, param in params.items():
            self.shadow[name].lerp_(param.detach().float().to(self.shadow[name].device), 1 - self.decay)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.decay = state["decay"]
        self.shadow = {k: v.clone() for k, v in state["shadow"].items()}
