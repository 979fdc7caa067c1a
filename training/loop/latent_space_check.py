"""Before fine-tuning public weights: do they speak the latent space the run is about to teach?

The starting student and the reference VAE encode the same held-out clips; the student's latents
are compared with the reference's raw latents mapped into every space the family supports
(models/reference_vae.py). mismatch(space) = mean((student - reference)^2) / mean(reference^2):
about 0 when the student encodes to that space, 1 or more when it does not. The run is refused
when the configured space is clearly worse than another: mismatch at least 1.5 times the best
one's and at least 0.05 above it (a student far from every space, as one trained from scratch,
is not refused: its mismatches are all large and close). `latent_space_check=false` skips it.
"""

from __future__ import annotations

import torch

from models.reference_families import SUPPORTED_LATENT_SPACES
from models.reference_vae import latent_space_transform

RATIO, MARGIN = 1.5, 0.05


def channel_stats(latents: torch.Tensor) -> dict:
    """Per-channel mean, std and RMS of N,t,C,h,w latents, as lists."""
    per_channel = latents.transpose(0, 2).reshape(latents.shape[2], -1)
    return {"mean": per_channel.mean(1).tolist(), "std": per_channel.std(1).tolist(),
            "rms": per_channel.pow(2).mean(1).sqrt().tolist()}


@torch.no_grad()
def latent_space_report(student, reference, videos: list[torch.Tensor]) -> dict:
    """videos: N,T,3,H,W in [0, 1] on the reference's device, at a frame count the family takes."""
    student_latents, raw = [], []
    for video in videos:
        student_latents.append(student.encode_video(video.to(next(student.parameters()).dtype)).float())
        raw.append(reference.encode(video) / reference.scale + reference.shift)  # back to the raw latents
    student_latents, raw = torch.cat(student_latents), torch.cat(raw)
    report = {"configured": reference.latent_space, "student": channel_stats(student_latents), "spaces": {}}
    for space in SUPPORTED_LATENT_SPACES[reference.family]:
        shift, scale = (t.to(raw.device).view(1, 1, -1, 1, 1) for t in latent_space_transform(reference.vae, space))
        target = (raw - shift) * scale
        mismatch = ((student_latents - target).pow(2).mean() / target.pow(2).mean().clamp_min(1e-12)).item()
        report["spaces"][space] = {"mismatch": mismatch, **channel_stats(target)}
    return report


def latent_space_problem(report: dict) -> str:
    """'' when the configured space is not clearly worse than another, else the one-line refusal."""
    mismatch = {space: values["mismatch"] for space, values in report["spaces"].items()}
    configured, best = report["configured"], min(mismatch, key=mismatch.get)
    if best == configured or not (mismatch[configured] >= RATIO * mismatch[best] and mismatch[configured] - mismatch[best] >= MARGIN):
        return ""
    return (f"the starting weights encode to the reference's {best} latents (mismatch {mismatch[best]:.3f}), not to the "
            f"{configured} ones this run would teach (mismatch {mismatch[configured]:.3f}): set ref_vae_latent_space={best}, "
            "or latent_space_check=false to train toward the configured space anyway")


def summary_line(report: dict) -> str:
    spaces = ", ".join(f"{space} {values['mismatch']:.3f}" for space, values in report["spaces"].items())
    rms = report["student"]["rms"]
    return (f"latent space check: student vs reference mismatch by space: {spaces} (configured: {report['configured']}); "
            f"student latent RMS per channel {min(rms):.2f}-{max(rms):.2f}")
