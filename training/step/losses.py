"""What one micro-step computes: the local loss terms (forward_losses), then Seraena's term across
ranks (add_seraena_term)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.metrics import aligned, psnr, ycbcr
from models.taehv import TAEHV
from training.config.terms import active_terms, source, student_needs, term_weights
from training.step.seraena import SeraenaState


class Student(nn.Module):
    """The TAEHV being trained, with one forward for everything a step needs (DeepSpeed engines
    run their bookkeeping in forward). Only the requested outputs are computed."""

    def __init__(self, taehv: TAEHV):
        super().__init__()
        self.taehv = taehv
        self.frozen_weights: dict[str, torch.Tensor] = {}  # fp32 values of frozen parameters (training/loop/build.py)
        self.last_layer: LastLayerTap | None = None  # set by tap_last_layer (adaptive_adversarial)

    def tap_last_layer(self) -> "Student":
        """Record the decoder's last convolution in each forward, for adaptive_weight."""
        self.last_layer = LastLayerTap(self.taehv)
        return self

    def forward(self, video: torch.Tensor, reference_latents: torch.Tensor | None,
                want_latents: bool, want_roundtrip: bool, want_reference_decode: bool) -> dict:
        """video: N,T,3,H,W in [0, 1], fp32 (the targets' copy); reference_latents fp32. Both are
        cast here, where they enter the model, to the dtype its weights are in (bf16 under a bf16
        DeepSpeed engine): nothing outside the student sees a bf16 copy of the video."""
        dtype = next(self.taehv.parameters()).dtype
        decode = self.last_layer.decode if self.last_layer is not None else lambda name, z: self.taehv.decode_video(z)
        if self.last_layer is not None:
            self.last_layer.release()
        outputs = {}
        if want_latents or want_roundtrip:
            outputs["latents"] = self.taehv.encode_video(video.to(dtype))
        if want_roundtrip:
            outputs["roundtrip"] = decode("roundtrip", outputs["latents"])
        if want_reference_decode:
            outputs["reference_decode"] = decode("reference_decode", reference_latents.to(dtype))
        return outputs


class LastLayerTap:
    """What adaptive_weight needs of the decoder's last convolution W, recorded in each forward: the
    input of W in each decode (a forward hook that records only inside Student.forward, not in a
    checkpointed recompute), by the name of the output that decode made.

    d loss / d W is then found without the engine seeing a backward: autograd stops at the loss's
    views of the student's outputs (StepLosses.outputs), and the last layer and the tail of
    decode_video are replayed on a detached copy of W. DeepSpeed hooks the outputs of its forward
    and every parameter: a torch.autograd.grad that crosses either starts the engine's backward
    bookkeeping outside engine.backward (its gradient reduction then fails: IndexError in
    reduce_ipg_grads). The values are those of autograd.grad with respect to W itself."""

    def __init__(self, taehv: TAEHV):
        self.taehv = taehv
        self.conv = decoder_last_conv(taehv)
        self.calls: dict[str, tuple[torch.Tensor, int, int]] = {}  # output name -> (input of W, N, latent frames)
        self.decoding: tuple[str, int, int] | None = None  # set by Student.forward around each decode
        self.conv.register_forward_hook(self._record)

    def _record(self, module, inputs, output) -> None:
        if self.decoding is not None and output.requires_grad:
            name, n, latent_frames = self.decoding
            self.calls[name] = (inputs[0], n, latent_frames)

    def decode(self, name: str, latents: torch.Tensor) -> torch.Tensor:
        self.decoding = (name, latents.shape[0], latents.shape[1])
        try:
            return self.taehv.decode_video(latents)
        finally:
            self.decoding = None

    def weight_gradient(self, loss: torch.Tensor, outputs: dict) -> torch.Tensor | None:
        """d loss / d W, summed over the recorded decodes; `outputs`: the loss's views of the
        student's outputs, by name. None when the loss reaches none of them."""
        names = [name for name in self.calls if name in outputs]
        gradients = torch.autograd.grad(loss, [outputs[name] for name in names], retain_graph=True, allow_unused=True)
        weight, bias = self.conv.weight.detach().requires_grad_(), self.conv.bias
        total = None
        for name, gradient in zip(names, gradients):
            if gradient is None:
                continue
            inputs, n, latent_frames = self.calls[name]
            with torch.enable_grad():
                # in the forward's dtype: under DDP's bf16 autocast the input is bf16 and the weight fp32,
                # and autocast cast both to bf16 for the convolution; the cast is differentiated through
                dtype = inputs.dtype
                raw = self.conv._conv_forward(inputs.detach(), weight.to(dtype), None if bias is None else bias.detach().to(dtype))
                frames = self.taehv.frames_from_decoder(raw.reshape(n, -1, *raw.shape[1:]), latent_frames)
                (part,) = torch.autograd.grad(frames, weight, gradient.to(frames.dtype))
            total = part if total is None else total + part
        return total

    def release(self) -> None:
        self.calls = {}


def pixel_loss(kind: str, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.l1_loss(prediction, target) if kind == "l1" else F.mse_loss(prediction, target)


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
    weights: dict | None = None  # {term: its scheduled weight in this step} (training/config/terms.py weight_at)
    outputs: dict | None = None  # the student's outputs as the terms read them (views: LastLayerTap stops there)

    def nonfinite(self) -> torch.Tensor:
        """A 0-dim bool tensor on the device, for agree(): reading it here would wait for the GPU."""
        bad = ~torch.isfinite(self.total)
        if self.seraena_inputs is not None:  # the discriminator must never see a non-finite decode
            bad = bad | ~torch.isfinite(self.seraena_inputs[1]).all()
        return bad


def _latent_mse(config, latents, video, reference_latents, lpips):
    return F.mse_loss(latents.float(), reference_latents.float())


def _pixels(config, decoded, video, reference_latents, lpips):
    decoded = decoded.float()
    return pixel_loss(config.pixel_loss, decoded, aligned(video, decoded))


def _chroma(config, decoded, video, reference_latents, lpips):
    decoded, target = decoded.float(), aligned(video, decoded)
    if config.chroma_pool != 1:  # each cell's mean colour (chroma is linear in RGB: pooling first is the same)
        decoded, target = pool_frames(decoded, config.chroma_pool), pool_frames(target, config.chroma_pool)
    return pixel_loss(config.pixel_loss, ycbcr(decoded)[:, :, 1:], ycbcr(target)[:, :, 1:])


def pool_frames(video: torch.Tensor, factor: int) -> torch.Tensor:
    """N,T,C,H,W average-pooled factor x factor in each frame (a remainder row or column is dropped)."""
    return F.avg_pool2d(video.flatten(0, 1), factor).unflatten(0, video.shape[:2])


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
    return pixel_loss(config.pixel_loss, frame_changes(decoded), frame_changes(aligned(video, decoded)))


# the formula of each local term, by name; what it reads and needs is its record in training/config/terms.py
TERM_LOSSES = {"encoder": _latent_mse, "decoder": _pixels, "reconstruction": _pixels, "chroma": _chroma,
               "perceptual": _perceptual, "temporal": _temporal}


def halved_at(config, step: int) -> bool:
    """Whether optimizer step `step` (1-based) trains on its clips average-pooled 2x (half_size_every)."""
    return bool(config.half_size_every) and step % config.half_size_every == 0


def at_step_scale(config, video: torch.Tensor, step: int) -> torch.Tensor:
    """The clips optimizer step `step` (1-based) trains on: every half_size_every-th step
    average-pooled 2x (mixed scales), else as they are. Every micro-step of a step, on every
    rank, has the same scale."""
    return halve(video) if halved_at(config, step) else video


def halve(video: torch.Tensor) -> torch.Tensor:
    return pool_frames(video, 2)


def forward_losses(config, student, video: torch.Tensor, reference_latents: torch.Tensor | None,
                   lpips: nn.Module | None = None, step: int | None = None) -> StepLosses:
    """The student's forward and every loss term that needs no other rank. `video` (N,T,3,H,W in
    [0, 1]) and `reference_latents` are fp32: they are the targets, and every term compares fp32
    with fp32 (one dtype per loss kernel, as CUDA requires); the student casts its own input. No collective runs
    here (training/base/agreement.py): Seraena's term, whose discriminator update all-reduces, is
    added by add_seraena_term once every rank agreed the step is good. `step`: the optimizer step
    whose schedules weigh the terms (None: every term at its full weight). A term scheduled to
    weight 0 is not computed; the student computes the same outputs in every step (the config rules
    make sure a term that starts at once reads each of them)."""
    distill = reference_latents is not None
    weights = term_weights(config, step, distill) if step is not None else {
        term.name: getattr(config, term.weight_key) for term in active_terms(config, distill)}
    needs = student_needs(config, distill)
    outputs = student(video, reference_latents, want_latents=needs.latents, want_roundtrip=needs.roundtrip,
                      want_reference_decode=needs.reference_decode)
    outputs = {name: output.view_as(output) for name, output in outputs.items()}  # see LastLayerTap
    terms, seraena_inputs = {}, None
    for term in active_terms(config, distill):  # in the table's order: the total's sum as before
        read = outputs[source(term, distill)]
        if term.across_ranks:  # Seraena's: what add_seraena_term needs (its critic may warm up at weight 0)
            seraena_inputs = (video, read.float(), reference_latents if distill else outputs["latents"])
        elif weights[term.name] > 0:
            terms[term.name] = (weights[term.name], TERM_LOSSES[term.name](config, read, video, reference_latents, lpips))
    total = sum((weight * value for weight, value in terms.values()), torch.zeros((), device=video.device))
    shown = outputs.get("reference_decode", outputs.get("roundtrip"))
    logged = {name: value.detach() for name, (_, value) in terms.items()}
    if step is not None:  # train/<term>_weight in TensorBoard: the schedules as they ran
        logged.update({f"{name}_weight": torch.tensor(weight) for name, weight in weights.items()})
    logged["loss"] = total.detach()
    if shown is not None:  # nothing is decoded when only the encoder term is on
        logged["psnr"] = psnr(shown.detach().float(), aligned(video, shown)).mean()
    return StepLosses(total, logged, seraena_inputs, weights, outputs)


def add_seraena_term(config, seraena: "SeraenaState | None", losses: StepLosses, update_discriminator: bool = True,
                     last_layer: LastLayerTap | None = None) -> torch.Tensor:
    """The total with Seraena's term added (its discriminator step all-reduces across ranks: call
    it on every rank, after the agreement, or on none; every rank takes the same branch, the
    weight and the update being functions of the step). The loop updates the discriminator on the
    last micro-step of each optimizer step from discriminator_start_step on. Before the term's
    schedule starts, the discriminator may warm up alone. last_layer: the student's tap of the
    decoder's last convolution (Student.tap_last_layer), for adaptive_adversarial."""
    if seraena is None or losses.seraena_inputs is None:
        return losses.total
    weight = losses.weights["seraena"] if losses.weights is not None else config.seraena_weight
    if weight == 0:  # before its schedule: the critic warms up alone, or waits
        if update_discriminator:
            seraena.discriminator_step(*losses.seraena_inputs)
            log_seraena_stats(seraena, losses.logged)
        return losses.total
    term = seraena.loss(*losses.seraena_inputs, update_discriminator=update_discriminator)
    losses.logged["seraena"] = term.detach()
    log_seraena_stats(seraena, losses.logged)
    if config.adaptive_adversarial:
        scale = adaptive_weight(losses.total, term, last_layer, losses.outputs, config.adaptive_weight_max)
        losses.logged["seraena_adaptive_weight"] = scale
        weight = weight * scale
    total = losses.total + weight * term
    losses.logged["loss"] = total.detach()
    return total


def warm_late_terms(config, losses: StepLosses, video: torch.Tensor, reference_latents: torch.Tensor | None,
                    seraena: "SeraenaState | None", lpips: nn.Module | None) -> list[str]:
    """cuDNN's autotuning (cudnn.benchmark) times each convolution shape at its first use. A term whose
    schedule starts late (vidtok's adversarial term at step 20,000, a ramped LPIPS) would meet its
    shapes then: tuned mid-run, with that step's activations live, where the plan holds all tuning
    in the first step. The loop calls this in its first micro-step: each term weighted 0 now runs
    once, forward and backward, on detached copies of the student's outputs (Seraena's on a copy of
    its discriminator, correction included), so nothing of the run changes. Returns the terms warmed."""
    if losses.weights is None or not torch.backends.cudnn.benchmark:
        return []
    distill, warmed = reference_latents is not None, []
    for term in active_terms(config, distill):
        if losses.weights[term.name] > 0:
            continue
        if term.across_ranks:
            if seraena is not None and losses.seraena_inputs is not None:
                seraena.warm_up(*losses.seraena_inputs)
                warmed.append(term.name)
            continue
        read = losses.outputs[source(term, distill)].detach().requires_grad_()
        TERM_LOSSES[term.name](config, read, video, reference_latents, lpips).backward()
        warmed.append(term.name)
    return warmed


def generators_kept(device: torch.device):
    """A context in which the CPU generator and `device`'s are forked (torch.random.fork_rng): a warm-up
    draws nothing from the run's random streams, so a resumed run, which warms up again, continues
    exactly as the run it resumes."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type)


def shape_twin(student: Student) -> Student:
    """A Student built as `student` is, for cuDNN's tuning: the same construction arguments,
    checkpointing and fast path (NHWC activations, the compiled runner), and each parameter's device,
    dtype, memory format and requires_grad, with weights of its own: the algorithm cuDNN times for a
    convolution depends on shapes, dtypes and layouts, never on values. Built, not copied: a ZeRO-3
    engine's parameters hold only this rank's partition, and a copy would carry the engine's hooks."""
    live = student.taehv
    taehv = TAEHV.from_args(live.args).to(next(live.parameters()).device)
    taehv.set_gradient_checkpointing(live.gradient_checkpointing)
    taehv.channels_last, taehv.parallel_runner = live.channels_last, live.parallel_runner
    sources = dict(live.named_parameters())
    with torch.no_grad():
        for name, param in taehv.named_parameters():
            source = sources[name]
            if source.shape == param.shape:  # its strides (NHWC weights); a ZeRO-3 partition is flat: NCHW, as ZeRO keeps them
                param.data = torch.empty_strided(param.shape, source.stride(), dtype=source.dtype, device=param.device).copy_(param)
            else:
                param.data = param.data.to(source.dtype)
            param.requires_grad_(source.requires_grad)
    return Student(taehv.train())


def warm_scale(config, twin: Student, video: torch.Tensor, seraena: "SeraenaState | None", lpips: nn.Module | None) -> None:
    """cuDNN's tuning of one more scale of the clips (half_size_every's pooled steps, in autoencoder
    mode): the student's forward and backward with every term on, at its full weight, and Seraena's
    discriminator and correction (on its copy), on a shape_twin of the student, so nothing of the run
    changes. `video`: N,T,3,H,W in [0, 1] at that scale; the caller's precision context applies."""
    losses = forward_losses(config, twin, video, None, lpips)  # step None: every term that is on
    total = losses.total
    if losses.seraena_inputs is not None:  # its term's gradient reaches the student through the decode
        total = total + losses.seraena_inputs[1].square().mean()
    if total.requires_grad:
        total.backward()
    if seraena is not None and losses.seraena_inputs is not None:
        seraena.warm_up(*losses.seraena_inputs)


def log_seraena_stats(seraena: "SeraenaState", logged: dict) -> None:
    # the adversarial game in TensorBoard: train/seraena_discriminator_loss, _accuracy, _gradient_std
    logged.update({f"seraena_{k}": v for k, v in seraena.seraena.last_stats.items()})
    seraena.seraena.last_stats = {}


def adaptive_weight(reconstruction: torch.Tensor, adversarial: torch.Tensor, last_layer: LastLayerTap,
                    outputs: dict, clamp: float) -> torch.Tensor:
    """VQGAN's adaptive weight: ||d rec / d W|| / ||d adv / d W|| on the decoder's last layer W,
    clamped to [0, clamp], detached (a 0-dim tensor on the device: no sync). The adversarial
    term then pulls on W as hard as the reconstruction terms do. Local: autograd.grad reduces
    nothing across ranks, and no engine's backward hook runs (LastLayerTap). `outputs`: the
    terms' views of the student's outputs (StepLosses.outputs)."""
    try:
        rec_grad, adv_grad = (last_layer.weight_gradient(loss, outputs) for loss in (reconstruction, adversarial))
    finally:
        last_layer.release()
    if rec_grad is None or adv_grad is None:  # no reconstruction term reaches W: the configured weight alone
        warnings.warn("adaptive_adversarial: the adaptive weight fell back to 1.0 (no reconstruction or adversarial "
                      "gradient reaches the decoder's last layer); the configured seraena_weight is used alone")
        return torch.ones((), device=adversarial.device)
    ratio = rec_grad.float().norm() / (adv_grad.float().norm() + 1e-4)
    return ratio.clamp(0.0, clamp).detach()


def decoder_last_conv(taehv: TAEHV) -> nn.Conv2d:
    """The decoder's last convolution (what adaptive_weight measures on)."""
    return [m for m in taehv.decoder.modules() if isinstance(m, nn.Conv2d)][-1]


def compute_losses(config, student, video: torch.Tensor, reference_latents: torch.Tensor | None,
                   seraena: SeraenaState | None, lpips: nn.Module | None = None) -> tuple[torch.Tensor, dict]:
    """Total weighted loss and the detached terms for logging, in one call (one process, or
    callers that know every rank's forward succeeded)."""
    losses = forward_losses(config, student, video, reference_latents, lpips)
    return add_seraena_term(config, seraena, losses, last_layer=student.last_layer), losses.logged
