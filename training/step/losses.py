"""What one micro-step computes: the local loss terms (forward_losses), then Seraena's term across
ranks (add_seraena_term)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.metrics import psnr
from models.taehv import TAEHV
from training.config.terms import active_terms, source, student_needs

if TYPE_CHECKING:
    from training.step.seraena import SeraenaState


class Student(nn.Module):
    """The TAEHV being trained, with one forward for everything a step needs (DeepSpeed engines
    run their bookkeeping in forward). Only the requested outputs are computed."""

    def __init__(self, taehv: TAEHV):
        super().__init__()
        self.taehv = taehv
        self.frozen_weights: dict[str, torch.Tensor] = {}  # fp32 values of frozen parameters (training/loop/build.py)

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


def frame_changes(video: torch.Tensor) -> torch.Tensor:
    """N,T-1,C,H,W: frame t+1 minus frame t."""
    return video[:, 1:] - video[:, :-1]


@dataclass
class StepLosses:
    """What one rank's forward produced, before any collective: the weighted total of the local
    terms, the detached terms for logging, and what the Seraena term still needs (or None)."""

    total: torch.Tensor
    logged: dict
    seraena_inputs: tuple | None = None  # (input video, decoded frames with their graph, latent context)

    def nonfinite(self) -> torch.Tensor:
        """A 0-dim bool tensor on the device, for agree(): reading it here would wait for the GPU."""
        bad = ~torch.isfinite(self.total)
        if self.seraena_inputs is not None:  # the discriminator must never see a non-finite decode
            bad = bad | ~torch.isfinite(self.seraena_inputs[1]).all()
        return bad


def _latent_mse(config, latents, video, reference_latents, lpips):
    return F.mse_loss(latents.float(), reference_latents)


def _pixels(config, decoded, video, reference_latents, lpips):
    decoded = decoded.float()
    return pixel_loss(config.pixel_loss, decoded, aligned(video, decoded))


def _perceptual(config, decoded, video, reference_latents, lpips):
    if lpips is None:
        raise ValueError("perceptual_weight > 0 but no LPIPS model was given (models.metrics.load_lpips)")
    decoded = decoded.float()
    # bf16 autocast under a bf16 run (lpips_bf16): AlexNet's convolutions on tensor cores
    with torch.autocast(decoded.device.type, torch.bfloat16, enabled=config.lpips_bf16 and config.mixed_precision == "bf16"):
        perceptual = lpips(decoded, aligned(video, decoded)).mean()
    return perceptual.float()


def _temporal(config, decoded, video, reference_latents, lpips):
    decoded = decoded.float()
    return pixel_loss(config.pixel_loss, frame_changes(decoded), frame_changes(aligned(video, decoded).float()))


# the formula of each local term, by name; what it reads and needs is its record in training/config/terms.py
TERM_LOSSES = {"encoder": _latent_mse, "decoder": _pixels, "reconstruction": _pixels, "perceptual": _perceptual,
               "temporal": _temporal}


def forward_losses(config, student, video: torch.Tensor, reference_latents: torch.Tensor | None,
                   lpips: nn.Module | None = None) -> StepLosses:
    """The student's forward and every loss term that needs no other rank. No collective runs
    here (training/base/agreement.py): Seraena's term, whose discriminator update all-reduces, is
    added by add_seraena_term once every rank agreed the step is good."""
    distill = reference_latents is not None
    needs = student_needs(config, distill)
    outputs = student(video, reference_latents, want_latents=needs.latents, want_roundtrip=needs.roundtrip,
                      want_reference_decode=needs.reference_decode)
    terms, seraena_inputs = {}, None
    for term in active_terms(config, distill):  # in the table's order: the total's sum as before
        read = outputs[source(term, distill)]
        if term.across_ranks:  # Seraena's: what add_seraena_term needs
            seraena_inputs = (video, read.float(), reference_latents if distill else outputs["latents"])
        else:
            terms[term.name] = (getattr(config, term.weight_key),
                                TERM_LOSSES[term.name](config, read, video, reference_latents, lpips))
    total = sum((weight * value for weight, value in terms.values()), torch.zeros((), device=video.device))
    shown = outputs.get("reference_decode", outputs.get("roundtrip"))
    logged = {name: value.detach() for name, (_, value) in terms.items()}
    logged["loss"] = total.detach()
    if shown is not None:  # nothing is decoded when only the encoder term is on
        logged["psnr"] = psnr(shown.detach(), aligned(video, shown)).mean()
    return StepLosses(total, logged, seraena_inputs)


def add_seraena_term(config, seraena: "SeraenaState | None", losses: StepLosses,
                     update_discriminator: bool = True) -> torch.Tensor:
    """The total with Seraena's term added (its discriminator step all-reduces across ranks: call
    it on every rank, after the agreement, or on none). The loop updates the discriminator on the
    last micro-step of each optimizer step only."""
    if seraena is None or losses.seraena_inputs is None:
        return losses.total
    term = seraena.loss(*losses.seraena_inputs, update_discriminator=update_discriminator)
    losses.logged["seraena"] = term.detach()
    # the adversarial game in TensorBoard: train/seraena_discriminator_loss, _accuracy, _gradient_std
    losses.logged.update({f"seraena_{k}": v for k, v in seraena.seraena.last_stats.items()})
    seraena.seraena.last_stats = {}
    total = losses.total + config.seraena_weight * term
    losses.logged["loss"] = total.detach()
    return total


def compute_losses(config, student, video: torch.Tensor, reference_latents: torch.Tensor | None,
                   seraena: SeraenaState | None, lpips: nn.Module | None = None) -> tuple[torch.Tensor, dict]:
    """Total weighted loss and the detached terms for logging, in one call (one process, or
    callers that know every rank's forward succeeded)."""
    losses = forward_losses(config, student, video, reference_latents, lpips)
    return add_seraena_term(config, seraena, losses), losses.logged
