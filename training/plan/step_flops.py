"""FLOPs of one training micro-step at a config's shape, counted on the meta device: nothing runs
and nothing is allocated, so the h100 profile's 8 x 9 x 480x720 step is counted on a laptop.

Counted with torch.utils.flop_counter (convolutions and matmuls, forward and backward; elementwise
work is not counted, as in every MFU figure), with one change (count_flops): a convolution counts
only the products of its kernel with input values, not with the zero padding around them, which
torch's formula counts and which the kernels skip (oneDNN's on a CPU measurably: a 3x3 convolution
at 8x8, where 16% of the products are with padding, ran 16% faster than at 64x64 by torch's count,
and at the same rate without them). At 480x720 the padding is a fraction of a percent of the
student's work; at the 32x32 of the CPU benchmark, 11% of torch's count.
Part by part as the loop computes them:
- student: the encode and decodes its loss terms need (training/step/losses.py), forward and backward;
- lpips: forward on the judged decode and its backward to the decoded frames (weights frozen);
- seraena: the discriminator step (forward and backward) and the correction (a no-grad forward of
  the reals, a forward of the fakes and its backward to them), once per micro-step at most;
- reference: the reference VAE's encode (no grad), with the published architecture of its family
  (the diffusers class's default config); 0 with a latent cache or in autoencoder mode.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.flop_counter import conv_backward_flop as torch_conv_backward_flop
from torch.utils.flop_counter import conv_flop as torch_conv_flop

from models.taehv import TAEHV
from training.config.terms import needs_module, student_needs
from training.config.views import measured_geometry, student_of


def _valid_taps(size: int, kernel: int, stride: int, padding: int, dilation: int, out: int) -> int:
    """(output position, kernel tap) pairs of one spatial dimension that read an input value, not padding."""
    taps = 0
    for tap in range(kernel):
        offset = tap * dilation - padding  # output o reads input o * stride + offset, inside when 0 <= it < size
        first = max(0, -(offset // stride))  # ceil(-offset / stride)
        last = min(out - 1, (size - 1 - offset) // stride)
        taps += max(0, last - first + 1)
    return taps


def _conv_products(x_shape, w_shape, stride, padding, dilation, out_shape) -> int:
    """Multiply-adds of a (not transposed) convolution, padding left out."""
    products = x_shape[0] * w_shape[0] * w_shape[1]  # batch x out channels x in channels per group
    for size, kernel, step, pad, dil, out in zip(x_shape[2:], w_shape[2:], stride, padding, dilation, out_shape[2:]):
        products *= _valid_taps(size, kernel, step, pad, dil, out)
    return products


def _conv_flop(x_shape, w_shape, _bias, stride, padding, dilation, transposed, *args, out_shape=None, **kwargs) -> int:
    if transposed or isinstance(padding, str):
        # torch's formula is wrapped to take the output itself (out_val) and pass on its shape
        return torch_conv_flop(x_shape, w_shape, _bias, stride, padding, dilation, transposed, *args, out_val=out_shape,
                               **kwargs)
    return 2 * _conv_products(x_shape, w_shape, stride, padding, dilation, out_shape)


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, stride, padding, dilation, transposed, output_padding,
                        groups, output_mask, out_shape=None, **kwargs) -> int:
    """The input gradient and the weight gradient each take the forward's products once."""
    if transposed or isinstance(padding, str):
        return torch_conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, stride, padding, dilation, transposed,
                                        output_padding, groups, output_mask, out_val=out_shape, **kwargs)
    return 2 * _conv_products(x_shape, w_shape, stride, padding, dilation, grad_out_shape) * (
        int(bool(output_mask[0])) + int(bool(output_mask[1])))


_CONVOLUTIONS = (torch.ops.aten.convolution, torch.ops.aten._convolution, torch.ops.aten.cudnn_convolution,
                 torch.ops.aten._slow_conv2d_forward, torch.ops.aten.convolution_overrideable)


def flop_counter() -> FlopCounterMode:
    """torch's FlopCounterMode, convolutions counted without their padding (the module docstring);
    the benchmark counts its measured peak's convolution with it too."""
    mapping = {op: _conv_flop for op in _CONVOLUTIONS}
    mapping[torch.ops.aten.convolution_backward] = _conv_backward_flop
    return FlopCounterMode(display=False, custom_mapping=mapping)


def count_flops(fn) -> float:
    """FLOPs of running fn() (forward and any backward it runs), counted by flop_counter()."""
    with flop_counter() as counter:
        fn()
    return float(counter.get_total_flops())


_counted = count_flops


def step_flops(config) -> dict[str, float]:
    """{part: FLOPs of one micro-step on one rank} for the parts above, and "total"."""
    batch, frames, height, width = config.batch_size_per_gpu, config.n_frames, config.height, config.width
    distill = config.use_ref_vae
    needs = student_needs(config)  # the outputs the terms on read (training/config/terms.py)
    parts: dict[str, float] = {}
    with torch.device("meta"):
        taehv = TAEHV(student_of(config)).train()
        video = torch.rand(batch, frames, 3, height, width)
        with torch.no_grad():
            latent_shape = taehv.encode_video(video).shape
        reference_latents = torch.randn(latent_shape)

        def student_step():
            outputs = []
            latents = taehv.encode_video(video) if needs.encode else None
            if needs.latents:
                outputs.append(latents)
            if needs.roundtrip:
                outputs.append(taehv.decode_video(latents))
            if needs.reference_decode:
                outputs.append(taehv.decode_video(reference_latents))
            sum(o.float().mean() for o in outputs).backward()

        parts["student"] = _counted(student_step)
        decoded_frames = taehv.decoded_frame_count(latent_shape[1])
        decoded = torch.rand(batch, decoded_frames, 3, height, width, requires_grad=True)
        if needs_module(config, "lpips"):
            from models.metrics import LPIPS

            lpips = LPIPS().requires_grad_(False)
            parts["lpips"] = _counted(lambda: lpips(decoded, video[:, :decoded_frames]).mean().backward())
        if needs_module(config, "seraena"):
            parts["seraena"] = _seraena_flops(decoded, reference_latents)
        if distill and not config.latent_cache:
            parts["reference"] = _reference_flops(config, video)
    parts["total"] = sum(parts.values())
    return parts


def _seraena_flops(decoded: torch.Tensor, latents: torch.Tensor) -> float:
    from models.seraena import SeraenaDiscriminator, group_frames, video_context

    groups = group_frames(decoded.detach())
    context = video_context(latents, groups.shape[0] // decoded.shape[0])
    disc = SeraenaDiscriminator(groups.shape[1], latents.shape[2]).train()

    def discriminator_step():
        disc(groups, context).float().pow(2).mean().backward()

    def correction():
        with torch.no_grad():
            real_scores = disc(groups, context)
        offset = torch.zeros_like(groups, requires_grad=True)
        gap = (disc(groups + offset, context) - real_scores).pow(2).mean()
        torch.autograd.grad(gap, [offset])

    return _counted(discriminator_step) + _counted(correction)


def _reference_flops(config, video: torch.Tensor) -> float:
    from models.reference_vae import reference_architecture

    vae = reference_architecture(config.reference_family, measured_geometry(config), config.ref_vae_path)
    pixels = video.permute(0, 2, 1, 3, 4) * 2 - 1
    with torch.no_grad():
        return _counted(lambda: vae.encode(pixels))
