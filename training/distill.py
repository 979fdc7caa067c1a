"""What one training step computes: student outputs, the weighted loss terms, Seraena targets,
and the averaged (EMA) weights that are validated and exported.

Loss terms (a weight of 0 skips the computation, not only the sum):
- encoder:        MSE(student encode(video), reference latents)
- decoder:        pixel loss(student decode(reference latents), aligned input frames)
- reconstruction: pixel loss(student decode(student encode(video)), aligned input frames)
- perceptual:     LPIPS(decoded frames, aligned input frames) (models/metrics.py)
- seraena:        MSE(decoded frames, Seraena-corrected targets), frames grouped in threes
- temporal:       pixel loss(decoded[t+1] - decoded[t], input[t+1] - input[t]): the frame-to-frame
                  changes of the decode against those of the input, the training form of the
                  flicker metric (models/metrics.py: its RMSE; here MSE or L1 as pixel_loss says)
The perceptual, Seraena and temporal terms look at one decode, "the judged decode": the decode of
reference latents when distilling (what a diffusion model hands the decoder, so what flickers in
use), else the round trip.
Decoded frame j shows input frame j (models/reference_vae.py), so "aligned" is the first frames.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        self.frozen_weights: dict[str, torch.Tensor] = {}  # fp32 values of frozen parameters (training/builders.py)

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
    replay buffer and random state are deliberately per rank (each holds its own fakes): the
    shared part is registered with accelerate for checkpointing, each rank's own part is written
    beside it as seraena_rank<R>.pt (rank_state_dict)."""

    def __init__(self, latent_channels: int, learning_rate: float, buffer_size: int, seed: int, rank: int,
                 device: torch.device, amp_dtype: torch.dtype | None):
        # the weights from a local generator seeded alike on every rank; the global generators
        # keep their per-rank state (nothing here may reseed them: that would reseed CUDA too)
        with torch.random.fork_rng(devices=[]):  # the default initialisation's CPU draws leave no trace
            self.seraena = Seraena(9, latent_channels, lr=learning_rate, buffer_size=buffer_size,
                                   seed=seed + rank, amp_dtype=amp_dtype, weight_seed=seed)
        if next(self.seraena.parameters()).device != torch.device(device):  # (a no-op .to() fails under fake tensors)
            self.seraena.to(device)

    def loss(self, real: torch.Tensor, decoded: torch.Tensor, latents: torch.Tensor,
             update_discriminator: bool = True) -> torch.Tensor:
        """Steps the discriminator (when asked: once per optimizer step of the student, so every
        profile with the same global batch plays the same game whatever its accumulation), then
        returns MSE(decoded, corrected target) for the student. The loop calls it only on a step
        every rank agreed is finite, decode included (StepLosses.nonfinite)."""
        real_groups = group_frames(aligned(real, decoded)).float()  # under bf16 engines the input video is bf16
        fake_groups = group_frames(decoded)
        context = video_context(latents.detach().float(), fake_groups.shape[0] // decoded.shape[0])
        if update_discriminator:
            self.seraena.discriminator_step(real_groups, fake_groups.detach().float(), context, reduce_gradients=all_reduce_mean)
            all_reduce_mean(self.seraena.batchnorm_buffers())
        target = self.seraena.correct(real_groups, fake_groups.detach().float(), context)
        return F.mse_loss(fake_groups.float(), target)

    def state_dict(self) -> dict:
        return {"weights": self.seraena.state_dict(), "training": self.seraena.training_state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.seraena.load_state_dict(state["weights"])
        self.seraena.load_training_state_dict(state["training"])

    def rank_state_dict(self, with_buffer: bool = True) -> dict:
        state = self.seraena.rank_state_dict()
        if not with_buffer:
            del state["buffer"]
        return state

    def load_rank_state_dict(self, state: dict) -> None:
        self.seraena.load_rank_state_dict(state)


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


def forward_losses(config, student, video: torch.Tensor, reference_latents: torch.Tensor | None,
                   lpips: nn.Module | None = None) -> StepLosses:
    """The student's forward and every loss term that needs no other rank. No collective runs
    here (training/agreement.py): Seraena's term, whose discriminator update all-reduces, is
    added by add_seraena_term once every rank agreed the step is good."""
    distill = reference_latents is not None
    judged = config.seraena_weight > 0 or config.perceptual_weight > 0 or config.temporal_weight > 0  # terms on "the" decode
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
        # bf16 autocast under a bf16 run (lpips_bf16): AlexNet's convolutions on tensor cores
        with torch.autocast(decoded.device.type, torch.bfloat16, enabled=config.lpips_bf16 and config.mixed_precision == "bf16"):
            perceptual = lpips(decoded, aligned(video, decoded)).mean()
        terms["perceptual"] = (config.perceptual_weight, perceptual.float())
    if config.temporal_weight > 0:
        decoded = judged_decode.float()
        terms["temporal"] = (config.temporal_weight, pixel_loss(config.pixel_loss, frame_changes(decoded),
                                                                frame_changes(aligned(video, decoded).float())))
    seraena_inputs = None
    if config.seraena_weight > 0:
        seraena_inputs = (video, judged_decode.float(), reference_latents if distill else outputs["latents"])
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


class WeightEMA:
    """fp32 exponential moving average of the student's weights (the fp32 masters under DeepSpeed,
    never their bf16 rounding), on every rank, on the training device. Registered with accelerate
    for checkpointing."""

    def __init__(self, weights: dict[str, torch.Tensor], decay: float, device: torch.device):
        self.decay, self.device = decay, torch.device(device)
        self.shadow = {k: v.detach().float().to(self.device).clone() for k, v in weights.items()}

    @torch.no_grad()
    def update(self, weights: dict[str, torch.Tensor]) -> None:
        """Blend in the current weights: fp32 (the optimizer's masters under DeepSpeed, see
        taehv_train.master_weights), one fused lerp over all tensors."""
        names = [n for n in self.shadow if n in weights]
        torch._foreach_lerp_([self.shadow[n] for n in names],
                             [weights[n].detach().to(self.device, torch.float32) for n in names], 1 - self.decay)

    def step(self, accelerator, model) -> None:
        """After an optimizer step: blend in the optimizer's fp32 weights (a gather under DeepSpeed)."""
        from training.checkpoints import master_weights

        self.update(master_weights(accelerator, model))

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        """accelerate loads custom state with map_location="cpu": the average goes back to the
        training device, or every later update would copy every parameter to the host."""
        self.decay = state["decay"]
        self.shadow = {k: v.to(self.device, torch.float32).clone() for k, v in state["shadow"].items()}


class PartitionedEMA:
    """The same average under ZeRO-1/2 without a collective per step: each rank averages only the
    fragments of the fp32 masters its optimizer partition holds (DeepSpeed's per-parameter
    `_hp_mapping`; elementwise, so the values are those of WeightEMA bit for bit), plus buffers and
    frozen weights, which every rank holds whole. `shadow` (validation, export, checkpoints; every
    rank calls it) gathers the full weights in one all-reduce. Checkpoints hold the full average,
    as WeightEMA's do, so exact and elastic resume read them alike."""

    def __init__(self, weights: dict[str, torch.Tensor], decay: float, device: torch.device, student):
        self.decay, self.device = decay, torch.device(device)
        self.student = student
        self.trained = {name: p for name, p in student.taehv.named_parameters() if name not in student.frozen_weights}
        self.order = list(weights)
        self.local: dict[str, torch.Tensor | None] = {}
        self.load_full(weights)

    def _fragment(self, name: str):
        return getattr(self.trained[name], "_hp_mapping", None)

    def load_full(self, weights: dict[str, torch.Tensor]) -> None:
        for name, value in weights.items():
            value = value.detach().to(self.device, torch.float32)
            if name not in self.trained:
                self.local[name] = value.clone()
            elif self._fragment(name) is None:  # this rank's partition holds none of it
                self.local[name] = None
            else:
                address = self._fragment(name).lp_fragment_address
                self.local[name] = value.flatten()[address.start: address.start + address.numel].clone()

    def current(self, name: str) -> torch.Tensor:
        if name in self.trained:
            return self._fragment(name).hp_fragment
        if name in self.student.frozen_weights:
            return self.student.frozen_weights[name]
        return self.student.taehv.get_buffer(name)

    @torch.no_grad()
    def step(self, accelerator=None, model=None) -> None:
        names = [n for n, v in self.local.items() if v is not None]
        torch._foreach_lerp_([self.local[n] for n in names],
                             [self.current(n).detach().to(self.device, torch.float32) for n in names], 1 - self.decay)

    @property
    def shadow(self) -> dict[str, torch.Tensor]:
        """The full average on every rank: each rank writes its fragments into a zero buffer of all
        trained weights, one all-reduce sums them (fragments do not overlap)."""
        import torch.distributed as dist

        names = [n for n in self.order if n in self.trained]
        sizes = [self.trained[n].numel() for n in names]
        flat = torch.zeros(sum(sizes), device=self.device, dtype=torch.float32)
        for part, name in zip(flat.split(sizes), names):
            if self.local[name] is not None:
                address = self._fragment(name).lp_fragment_address
                part[address.start: address.start + address.numel] = self.local[name]
        group = next((p._dp_group for p in self.trained.values() if hasattr(p, "_dp_group")), None)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flat, group=group)
        full = {name: part.view(self.trained[name].shape) for part, name in zip(flat.split(sizes), names)}
        return {name: full[name] if name in full else self.local[name] for name in self.order}

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.decay = state["decay"]
        self.load_full(state["shadow"])
