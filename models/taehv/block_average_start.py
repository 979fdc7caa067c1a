"""A TAEHV that starts as the block-average codec: each decoded frame is its own frame's mean colour
per latent cell (8p x 8p pixels), upsampled, before any training.

Trained from scratch on a few CPU minutes, a random TAEHV learns luma first and colour last: on
footage it never saw it stays greyer than a blur (docs/benchmarks.md, issue 61). Started here it
only has to learn what the blur lacks, the way super-resolution nets learn a residual over an
interpolation. Only the starting weights change: the layers, names and shapes are the public ones,
so exports load in the public taehv.py as before.

How: a few channels of every layer, the "colour path", carry RGB means and nothing else. The
encoder averages each 2x2 at its three stride-2 convolutions and stacks the frames that its time
pools join (latent channels 0..3t-1: t frames x RGB, scaled by LATENT_SCALE). The decoder puts each
output slot's frame in place at latent rate (its frame is the latent's first, or the previous
latent's next ones: the leading-frame trim), splits them at its time grows, and its upsampling
convolutions copy each cell to its 2x2 children but the last, which is bilinear (SMOOTH) around a
mid-grey channel: its zero padding pulls a border pixel a quarter of the way to grey, not to
black. Smoothing at every stage compounds those border errors (on the held-out source at 64x64,
chroma PSNR: copies only 36.49 dB, the last bilinear 37.04, all three 36.29; the bilinear 8x8
block average 37.32). All other channels keep their random start and read the path freely; no
path channel reads them, and the output reads only the path, so the start is exact. The residual
branches of the memory blocks add nothing to the path (their last rows start at zero); the first
one of the decoder moves frames instead, by memory (`past`).

RGB is in [0, 1], so every ReLU passes the path unchanged; the decoder's input Clamp (3 tanh(x/3))
is near the identity on latents of at most LATENT_SCALE (0.25: 0.23% off at 1)."""

from __future__ import annotations

import torch
import torch.nn as nn

from models.taehv.blocks import MemBlock, TGrow, TPool, UpsamplingConv
from models.variants import block_average_start_problem

LATENT_SCALE = 0.25
GREY = 0.5
# nearest 2x upsampling, then this: bilinear 2x (each output pixel 3/4 its own cell, 1/4 its neighbour)
SMOOTH = torch.outer(torch.tensor([0.25, 0.5, 0.25]), torch.tensor([0.25, 0.5, 0.25]))


def start_as_block_average(taehv) -> None:
    """Set `taehv`'s weights so that decode(encode(x)) is each frame's block average, each cell's mean
    on all its pixels (see the module docstring)."""
    problem = block_average_start_problem(taehv.args)
    if problem:
        raise ValueError(problem)
    with torch.no_grad():
        width = _encoder(taehv.encoder, taehv.args.patch_size)
        _decoder(taehv.decoder, width, taehv.args.patch_size)


def _only(conv: nn.Conv2d, rows: int) -> torch.Tensor:
    """Rows 0..rows-1 of `conv` cleared (weights and bias) for the path: returned for setting."""
    conv.weight[:rows] = 0
    if conv.bias is not None:
        conv.bias[:rows] = 0
    return conv.weight


def _centre(weight: torch.Tensor) -> tuple[int, int]:
    return weight.shape[2] // 2, weight.shape[3] // 2


def _copy(conv: nn.Conv2d, pairs, value: float = 1.0) -> None:
    """Each (row, column) pair: the output row reads that input channel at the kernel's centre."""
    weight = conv.weight
    i, j = _centre(weight)
    for row, column in pairs:
        weight[row, column, i, j] = value


def _quiet_branch(block: MemBlock, rows: int) -> None:
    _only(block.conv[-1], rows)  # the residual adds nothing to the path; the skip (identity) carries it


def _encoder(encoder: nn.Sequential, patch: int) -> int:
    first, last = encoder[0], encoder[-1]
    _only(first, 3)
    _copy(first, [(c, c * patch**2 + k) for c in range(3) for k in range(patch**2)], 1 / patch**2)
    width = 3
    for layer in encoder:
        if isinstance(layer, TPool):  # input channels: frame k's c at k * C + c, earliest first
            channels = layer.conv.weight.shape[0]
            _only(layer.conv, width * layer.stride)
            _copy(layer.conv, [(k * width + c, k * channels + c) for k in range(layer.stride) for c in range(width)])
            width *= layer.stride
        elif isinstance(layer, nn.Conv2d) and layer.stride == (2, 2):  # each output cell: its 2x2 input cells
            weight = _only(layer, width)
            for c in range(width):
                weight[c, c, 1:3, 1:3] = 0.25
        elif isinstance(layer, MemBlock):
            _quiet_branch(layer, width)
    _only(last, width)
    _copy(last, [(c, c) for c in range(width)], LATENT_SCALE)
    return width


def _decoder(decoder: nn.Sequential, width: int, patch: int) -> None:
    grey = width  # the mid-grey channel's row in every decoder layer, beside the widest path
    _only(decoder[1], grey + 1)
    _copy(decoder[1], [(c, c) for c in range(width)], 1 / LATENT_SCALE)
    decoder[1].bias[grey] = GREY
    blocks = [layer for layer in decoder if isinstance(layer, MemBlock)]
    _order_frames(blocks[0], width)
    for block in blocks[1:]:
        _quiet_branch(block, grey + 1)
    stage_convs = [layer for layer in decoder[2:-1] if isinstance(layer, nn.Conv2d)]
    for layer in decoder[2:-1]:
        if isinstance(layer, TGrow):  # output group k (rows k * C ...), earliest first: the path's k-th part
            channels = layer.conv.weight.shape[1]
            part = width // layer.stride
            for k in range(layer.stride):
                layer.conv.weight[k * channels : k * channels + grey + 1] = 0
                _copy(layer.conv, [(k * channels + c, k * part + c) for c in range(part)] + [(k * channels + grey, grey)])
            width = part
        elif isinstance(layer, nn.Conv2d):  # a stage's last convolution (of the input upsampled 2x, or not)
            _only(layer, grey + 1)
            _copy(layer, [(c, c) for c in range(width)] + [(grey, grey)])
            if layer is stage_convs[-1] and isinstance(layer, UpsamplingConv):
                i, j = _centre(layer.weight)
                for c in range(width):  # K * (x - grey) + grey
                    layer.weight[c, c] = SMOOTH
                    layer.weight[c, grey] = -SMOOTH
                    layer.weight[c, grey, i, j] += 1.0
    out = decoder[-1]
    out.weight.zero_()
    out.bias.zero_()
    _copy(out, [(c * patch**2 + k, c) for c in range(3) for k in range(patch**2)])


def _order_frames(block: MemBlock, width: int) -> None:
    """The decoder's first memory block puts in path group s the frame that output slot s shows:
    with t frames a latent and t - 1 leading frames trimmed, slot s < t - 1 shows the previous
    latent's frame s + 1 (its `past`), slot t - 1 this latent's first. Its first layer copies x's
    and past's path to rows 0..2w-1 (both >= 0, through the ReLUs), the second passes them on, the
    last writes (wanted - x), and the skip adds x back."""
    first, _, middle, _, last = block.conv
    channels = first.weight.shape[1] // 2  # the weight's columns: x's channels, then past's
    _only(first, 2 * width)
    _copy(first, [(c, c) for c in range(width)] + [(width + c, channels + c) for c in range(width)])
    _only(middle, 2 * width)
    _copy(middle, [(c, c) for c in range(2 * width)])
    _only(last, width + 1)  # and the grey channel's row (the decoder's `grey`)
    i, j = _centre(last.weight)
    frames = width // 3
    for slot in range(frames):
        for c in range(3):
            row = slot * 3 + c
            source = width + (slot + 1) * 3 + c if slot < frames - 1 else c  # past's next frame, or x's first
            last.weight[row, source, i, j] += 1.0
            last.weight[row, row, i, j] -= 1.0
