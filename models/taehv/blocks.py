"""TAEHV's building blocks and the encoder and decoders built from them.

Module attribute names and positions in the `nn.Sequential` containers define the state-dict keys
of the public weight files: do not rename or reorder."""

from __future__ import annotations

import torch
import torch.nn as nn

from models.variants import BASE_LAYOUT_WIDTHS, TAEHVArgs


def conv(n_in: int, n_out: int, **kwargs) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class Clamp(nn.Module):
    def forward(self, x):
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """Conv block that sees its own input at the previous frame (`past`)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.conv = nn.Sequential(
            conv(n_in * 2, n_out), nn.ReLU(inplace=True), conv(n_out, n_out), nn.ReLU(inplace=True), conv(n_out, n_out)
        )
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, past):
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class SuperMemBlock(nn.Module):
    """Residual depthwise/pointwise block of the super decoder, with the same `past` input."""

    def __init__(self, channels: int):
        super().__init__()
        c2 = channels * 2
        self.conv = nn.Sequential(
            nn.Conv2d(c2, c2, 7, padding=3, groups=c2, bias=False),
            nn.Conv2d(c2, channels * 4, 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels * 4, channels, 1, bias=False),
        )

    def forward(self, x, past):
        return self.conv(torch.cat([x, past], 1)) + x


class WideMemBlock(nn.Module):
    """MemBlock of the wide decoder: 1x1 convs mix channels, grouped 3x3 convs (64 channels per
    group) see space, which keeps 1024-channel stages affordable."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        groups = max(1, n_out // 64)
        self.conv = nn.Sequential(
            nn.Conv2d(n_in * 2, n_out, 1),
            nn.ReLU(inplace=True),
            conv(n_out, n_out, groups=groups),
            nn.ReLU(inplace=True),
            nn.Conv2d(n_out, n_out, 1),
            nn.ReLU(inplace=True),
            conv(n_out, n_out, groups=groups),
        )
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, past):
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class TPool(nn.Module):
    """Joins each run of `stride` consecutive frames (earliest first on channels) into one."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels * stride, channels, 1, bias=False)

    def forward(self, x):  # x: N*T, C, H, W with T a multiple of stride
        _, c, h, w = x.shape
        return self.conv(x.reshape(-1, self.stride * c, h, w))


class TGrow(nn.Module):
    """Splits each frame into `stride` consecutive frames (first channel group = earliest)."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels, channels * stride, 1, bias=False)

    def forward(self, x):  # x: N*T, C, H, W -> N*T*stride, C, H, W
        _, c, h, w = x.shape
        return self.conv(x).reshape(-1, c, h, w)


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
            nn.Upsample(scale_factor=2 if grow_in_space else 1),
            TGrow(c, 2 if grow_in_time else 1),
            conv(c, c_next, bias=False),
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
