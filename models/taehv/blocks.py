"""TAEHV's building blocks and the encoder and decoders built from them.

Module attribute names and positions in the `nn.Sequential` containers define the state-dict keys
of the public weight files: do not rename or reorder."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.variants import BASE_LAYOUT_WIDTHS, TAEHVArgs


def conv(n_in: int, n_out: int, **kwargs) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class Clamp(nn.Module):
    def forward(self, x):
        return torch.tanh(x / 3) * 3


class FrameAndPastConv(nn.Conv2d):
    """A convolution over cat([x, past], 1), its weights' first half for x and second for past (the
    public files' layout), that never builds the concatenation.

    Given `frames` instead of `past` (all T frames of N clips at once, past being x one frame
    earlier), it is one 3D convolution over N,C,T,H,W with a kernel two frames deep (the past half
    on the earlier frame), after one zero frame in front of each clip: neither the concatenation
    nor `past` is written, about an eighth of a training step's bytes (written in the forward and
    read again in the backward). In channels_last, N*T,C,H,W frames are an N,C,T,H,W tensor in
    channels_last_3d as they lie: the 3D convolution reads them in place. A module of its own so
    that DeepSpeed's ZeRO-3 hooks gather its weights before it runs."""

    def forward(self, x, past=None, frames=None):
        if past is not None:
            return super().forward(torch.cat([x, past], 1))
        channels = x.shape[1]
        now, before = self.weight.split(channels, 1)  # (its backward is one cat, in the weight's layout)
        clips = x.unflatten(0, (-1, frames)).transpose(1, 2)  # N,C,T,H,W
        clips = F.pad(clips, (0, 0, 0, 0, 1, 0))  # the zero frame before each clip's first
        weight = torch.stack([before, now], 2)  # O,C,2,kh,kw: the earlier frame first
        if x.is_contiguous(memory_format=torch.channels_last):  # else the kernel would pick NCDHW for its output
            weight = weight.contiguous(memory_format=torch.channels_last_3d)
        y = F.conv3d(clips, weight, self.bias, (1, *self.stride), (0, *self.padding))
        return y.transpose(1, 2).flatten(0, 1)


class MemBlock(nn.Module):
    """Conv block that sees its own input at the previous frame.

    forward(x, past) takes the previous frame's input (one frame at a time, or any past);
    forward(x, frames=T) runs all T frames of each clip at once, each frame seeing the one before."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.conv = self.layers(n_in, n_out)
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU(inplace=True)

    @staticmethod
    def layers(n_in: int, n_out: int) -> nn.Sequential:
        # the first ReLU out of place: in channels_last FrameAndPastConv returns a view of the 3D
        # convolution's output, and an in-place op on a view costs the backward a zero-filled copy,
        # a clone and two copies of the whole activation (AsStridedBackward, CopySlices)
        return nn.Sequential(FrameAndPastConv(n_in * 2, n_out, 3, padding=1), nn.ReLU(),
                             conv(n_out, n_out), nn.ReLU(inplace=True), conv(n_out, n_out))

    def forward(self, x, past=None, frames=None):
        first, *rest = self.conv  # (slicing the Sequential would build a new module each forward)
        h = first(x, past, frames)
        for layer in rest:
            h = layer(h)
        h += self.skip(x)  # in place on the last convolution's output: one tensor fewer
        return self.act(h)


class WideMemBlock(MemBlock):
    """MemBlock of the wide decoder: 1x1 convs mix channels, grouped 3x3 convs (64 channels per
    group) see space, which keeps 1024-channel stages affordable."""

    @staticmethod
    def layers(n_in: int, n_out: int) -> nn.Sequential:
        groups = max(1, n_out // 64)
        return nn.Sequential(FrameAndPastConv(n_in * 2, n_out, 1), nn.ReLU(),  # out of place: MemBlock.layers says why
                             conv(n_out, n_out, groups=groups), nn.ReLU(inplace=True),
                             nn.Conv2d(n_out, n_out, 1), nn.ReLU(inplace=True),
                             conv(n_out, n_out, groups=groups))


class SuperMemBlock(nn.Module):
    """Residual depthwise/pointwise block of the super decoder, with the same inputs as MemBlock
    (its depthwise first layer keeps x and past apart: it takes the concatenation)."""

    def __init__(self, channels: int):
        super().__init__()
        c2 = channels * 2
        self.conv = nn.Sequential(
            nn.Conv2d(c2, c2, 7, padding=3, groups=c2, bias=False),
            nn.Conv2d(c2, channels * 4, 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels * 4, channels, 1, bias=False),
        )

    def forward(self, x, past=None, frames=None):
        if past is None:  # each frame's predecessor in its clip, zeros before the first
            past = torch.zeros_like(x)
            past.unflatten(0, (-1, frames))[:, 1:] = x.unflatten(0, (-1, frames))[:, :-1]
        h = self.conv(torch.cat([x, past], 1))
        h += x
        return h


def regroup_frames(x: torch.Tensor, factor: float) -> torch.Tensor:
    """N*T,C,H,W -> N*T*factor,C/factor,H,W: consecutive frames' channels joined (factor < 1) or a
    frame's channel groups split into consecutive frames (factor > 1). A view in NCHW; in
    channels_last (NHWC) one copy that lands in channels_last (a plain reshape would copy to NCHW
    and the next convolution copy back)."""
    frames, channels, h, w = x.shape
    if factor == 1 or x.is_contiguous():
        return x.reshape(round(frames * factor), round(channels / factor), h, w)
    nhwc = x.permute(0, 2, 3, 1)
    if factor < 1:  # join: N*T/s, H, W, s*C
        joined = nhwc.unflatten(0, (-1, round(1 / factor))).permute(0, 2, 3, 1, 4).flatten(3, 4)
        return joined.contiguous().permute(0, 3, 1, 2)
    split = nhwc.unflatten(3, (round(factor), -1)).permute(0, 3, 1, 2, 4).flatten(0, 1)  # N*T*s, H, W, C
    return split.contiguous().permute(0, 3, 1, 2)


class TPool(nn.Module):
    """Joins each run of `stride` consecutive frames (earliest first on channels) into one."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels * stride, channels, 1, bias=False)

    def forward(self, x):  # x: N*T, C, H, W with T a multiple of stride
        return self.conv(regroup_frames(x, 1 / self.stride))


class TGrow(nn.Module):
    """Splits each frame into `stride` consecutive frames (first channel group = earliest)."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels, channels * stride, 1, bias=False)

    def forward(self, x):  # x: N*T, C, H, W -> N*T*stride, C, H, W
        return regroup_frames(self.conv(x), self.stride)


def _through_upsampling(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """A 3-tap axis of a kernel as the 4 taps of a stride-2 transposed convolution that upsamples 2x
    by nearest neighbour first: each output row of an upsampled pair reads two input rows, whose
    weights are the sums of the taps that land on them."""
    w0, w1, w2 = weight.unbind(dim)
    return torch.stack([w2, w1 + w2, w0 + w1, w0], dim)


class UpsamplingConv(nn.Conv2d):
    """A 3x3 convolution (padding 1) of the input upsampled 2x by nearest neighbour, run as one
    transposed convolution (stride 2, a 4x4 kernel made of sums of the 3x3 weights) on the input
    as it is. The published layout upsamples in a module of its own, then convolves: the
    upsampled copy (4x the input) is written, read, and written again as its gradient. Here it
    never exists, and each output pixel takes 4 products per input channel where it took 9: the
    same numbers up to rounding. Its weights are the 3x3 convolution's (the same key and shape);
    the Upsample's position holds an Identity."""

    def forward(self, x):
        # the sums in fp32 at least, one rounding to a bf16 weight's dtype; no constant is made on the
        # device (a host-to-device copy each step); transposed layout C_in,C_out,4,4
        weight = self.weight.to(torch.promote_types(self.weight.dtype, torch.float32))
        # summed in the weight's own memory order (O,kh,kw,I for NHWC): the gradient then comes back
        # in its layout, which autograd keeps (another layout is copied into it every backward)
        if weight.is_contiguous(memory_format=torch.channels_last):
            kernel = _through_upsampling(_through_upsampling(weight.permute(0, 2, 3, 1), 1), 2).permute(3, 0, 1, 2)
        else:
            kernel = _through_upsampling(_through_upsampling(weight, 2), 3).transpose(0, 1)
        kernel = kernel.to(self.weight.dtype)
        if x.is_contiguous(memory_format=torch.channels_last):
            kernel = kernel.contiguous(memory_format=torch.channels_last)
        return F.conv_transpose2d(x, kernel, self.bias, stride=2, padding=1)


MEMORY_BLOCKS = (MemBlock, SuperMemBlock, WideMemBlock)


def build_encoder(args: TAEHVArgs) -> nn.Sequential:
    p2 = args.patch_size**2
    layers: list[nn.Module] = [conv(3 * p2, 64), nn.ReLU(inplace=True)]
    for pool_in_time in args.encoder_time_downscale:
        layers += [
            TPool(64, 2 if pool_in_time else 1),
            conv(64, 64, stride=2, bias=False),
            MemBlock(64, 64),
            MemBlock(64, 64),
            MemBlock(64, 64),
        ]
    layers.append(conv(64, args.latent_channels))
    return nn.Sequential(*layers)


def build_base_decoder(args: TAEHVArgs) -> nn.Sequential:
    """The base layout; the "wide" kind has the same positions with wider stages and WideMemBlocks."""
    channels = BASE_LAYOUT_WIDTHS[args.decoder_kind]
    block = WideMemBlock if args.decoder_kind == "wide" else MemBlock
    layers: list[nn.Module] = [Clamp(), conv(args.latent_channels, channels[0]), nn.ReLU(inplace=True)]
    for stage, (c, grow_in_time, grow_in_space) in enumerate(
        zip(channels, args.decoder_time_upscale, args.decoder_space_upscale)
    ):
        c_next = channels[stage + 1] if stage + 1 < len(channels) else 64
        layers += [
            block(c, c),
            block(c, c),
            block(c, c),
            nn.Identity(),  # the published layout's Upsample: UpsamplingConv upsamples as it convolves
            TGrow(c, 2 if grow_in_time else 1),
            (UpsamplingConv if grow_in_space else nn.Conv2d)(c, c_next, 3, padding=1, bias=False),
        ]
    layers += [nn.ReLU(inplace=True), conv(64, 3 * args.patch_size**2)]
    return nn.Sequential(*layers)


def build_super_decoder(args: TAEHVArgs) -> nn.Sequential:
    channels = (512, 256, 128, 64)
    layers: list[nn.Module] = [nn.Conv2d(args.latent_channels, channels[0], 1, bias=False)]
    for stage, (grow_in_time, grow_in_space) in enumerate(zip(args.decoder_time_upscale, args.decoder_space_upscale)):
        c, c_next = channels[stage], channels[stage + 1]
        layers += [
            SuperMemBlock(c),
            SuperMemBlock(c),
            SuperMemBlock(c),
            conv(c, c_next * (4 if grow_in_space else 1)),
            nn.ReLU(inplace=True),
            nn.PixelShuffle(2) if grow_in_space else nn.Identity(),
            TGrow(c_next, 2 if grow_in_time else 1),
        ]
    layers.append(conv(64, 3 * args.patch_size**2))
    return nn.Sequential(*layers)
