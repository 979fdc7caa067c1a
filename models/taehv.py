"""TAEHV: Tiny AutoEncoder for video diffusion latents, compatible with the public weight files.

Conventions (same as the public TAEHV weights):
- videos are N,T,C,H,W RGB in [0, 1] (time before channels);
- latents are N,T,C,H,W, unscaled: exactly what the diffusion model consumes;
- `state_dict()` keys are positions in two `nn.Sequential` containers, `encoder` and `decoder`,
  so that public files (`taehv.pth`, `taecvx.pth`, `taew2_1.pth`, ...) load with strict=True.

The model is built from explicit arguments (variant, patch size, latent channels, time and space
flags, decoder kind, chunking). `TAEHV.from_pretrained` infers what it can from tensor shapes and
reads `model_info.json` beside the file for the rest; without one, a public file name
(`taecvx.pth`) picks among the variants whose shapes the file has.

Frame arithmetic comes from the time factors and the chunk rule, never from literal counts. It is
available on `TAEHVArgs` without building a model (`VARIANTS["taeh3"].latent_frame_count(22)`,
what training/config/schema.py should call) and on the model (`model.latent_frame_count(22)`):
- `t_downscale`, `t_upscale`: 2 ** (time stages switched on) in the encoder / decoder
  (4 for most variants, 8 for taeltx*); `frames_to_trim = t_upscale - 1`;
- `latent_frame_count(n_frames)`: latents `encode_video` returns for n frames;
- `decoded_frame_count(n_latents)`: frames `decode_video` returns for t latents;
- `frame_rule()`: (m, r) such that clips of m*k + r frames decode back to as many frames
  (4k+1; taecvx 8k+1; taeltx* 8k+1; taeh3 17k+5); `is_valid_frame_count(n)`,
  `valid_frame_counts(limit)` list them.
Chunked variants (`chunking="minimax_h3"`, taeh3) follow the MiniMax H3 VAE: the encoder pads T
with the last frame to whole 17-frame chunks, puts zero frames in front of each chunk up to a
multiple of t_downscale (3 -> 20 frames, 5 latents) and encodes every chunk with empty memory,
then drops the clip's last 3 latents; the decoder runs all latents as one sequence, drops the
first frames_to_trim frames of every 20-frame chunk and the last 3 x t_upscale frames.

Streaming: `StreamingTAEHV(model)` is upstream's API (`encode(x=None)` -> one latent or None,
`decode(x=None)` -> one frame or None, `flush_encoder()`, `flush_decoder()`, `flush()`, `reset()`);
`FrameStreamer` is this project's older list-returning API on single 4-D frames.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# the variants are plain data in models/variants.py (the launcher's config check reads them without torch)
from models.variants import BASE_LAYOUT_WIDTHS, VARIANTS, TAEHVArgs, check_args, resolve_args

# --------------------------------------------------------------------------------------------
# Building blocks (module attribute names define the state-dict keys: do not rename)
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Running a Sequential with memory blocks over time
# --------------------------------------------------------------------------------------------


def run_parallel(model: nn.Sequential, x: torch.Tensor, use_checkpointing: bool = False,
                 channels_last: bool = False) -> torch.Tensor:
    """All frames at once. x: N,T,C,H,W -> N,T',C',H',W'. With `channels_last`, activations stay
    NHWC between blocks (TPool and TGrow reshapes would otherwise hand on NCHW copies)."""
    n, t = x.shape[:2]
    x = x.reshape(n * t, *x.shape[2:])
    for block in model:
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)  # no copy when already NHWC
        if isinstance(block, MEMORY_BLOCKS):
            # past of frame t is the block's input at t-1, zeros for the first frame; one copy,
            # written through views so x's memory format (channels_last) carries over to past
            past = torch.zeros_like(x)
            past.view(n, -1, *x.shape[1:])[:, 1:] = x.view(n, -1, *x.shape[1:])[:, :-1]
            if use_checkpointing:
                x = checkpoint(block, x, past, use_reentrant=False)
            else:
                x = block(x, past)
        elif use_checkpointing and any(p.requires_grad for p in block.parameters()):
            x = checkpoint(block, x, use_reentrant=False)
        else:
            x = block(x)
    return x.reshape(n, -1, *x.shape[1:])


class SequentialRunner:
    """Feeds frames one at a time through a Sequential; memory is O(1) in the number of frames.

    Each memory block keeps its previous input, each TPool buffers frames until it has `stride`,
    each TGrow emits `stride` frames; frames leave in temporal order.
    """

    def __init__(self, model: nn.Sequential):
        self.model = model
        self.past: dict[int, torch.Tensor] = {}
        self.pool_buffers: dict[int, list[torch.Tensor]] = {}

    def push(self, frame: torch.Tensor) -> list[torch.Tensor]:
        """frame: N,C,H,W -> list of output frames (N,C',H',W'), possibly empty."""
        return list(self.outputs(frame))

    def outputs(self, frame: torch.Tensor) -> Iterator[torch.Tensor]:
        """Like `push`, but lazy: each output frame is computed when it is asked for, so a stream can
        show the first frame of a TGrow before computing the next. Exhaust it before the next call."""
        return self._walk(0, frame)

    def _walk(self, start: int, x: torch.Tensor) -> Iterator[torch.Tensor]:
        for index in range(start, len(self.model)):
            block = self.model[index]
            if isinstance(block, MEMORY_BLOCKS):
                past = self.past.get(index)
                self.past[index] = x
                x = block(x, torch.zeros_like(x) if past is None else past)
            elif isinstance(block, TPool):
                buffer = self.pool_buffers.setdefault(index, [])
                buffer.append(x)
                if len(buffer) < block.stride:
                    return
                del self.pool_buffers[index]
                x = block.conv(torch.cat(buffer, 1))
            elif isinstance(block, TGrow):
                grown = block.conv(x).unflatten(1, (block.stride, x.shape[1]))
                for step in range(block.stride):
                    yield from self._walk(index + 1, grown[:, step])
                return
            else:
                x = block(x)
        yield x


def run_sequential(model: nn.Sequential, x: torch.Tensor, show_progress_bar: bool = False) -> torch.Tensor:
    """Frame by frame; gives the same result as `run_parallel` to float rounding."""
    runner = SequentialRunner(model)
    frames = range(x.shape[1])
    if show_progress_bar:
        from tqdm.auto import tqdm

        frames = tqdm(frames, unit="frame")
    outputs = [y for t in frames for y in runner.outputs(x[:, t])]
    return torch.stack(outputs, 1)


def pad_with_last_frame(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """N,T,... -> N,T',... with T' the next multiple of `multiple`, repeating the last frame."""
    missing = -x.shape[1] % multiple
    return torch.cat([x, x[:, -1:].expand(-1, missing, *x.shape[2:])], 1) if missing else x


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class TAEHV(nn.Module):
    """Tiny video autoencoder.

    encode_video: N,T,3,H,W in [0, 1] -> N,t,L,H/(8p),W/(8p) unscaled latents,
        t = latent_frame_count(T) (ceil(T / t_downscale) without chunking)
    decode_video: N,t,L,h,w latents -> N,T',3,8ph,8pw in [0, 1], T' = decoded_frame_count(t)
        (t_upscale * t - frames_to_trim without chunking; CogVideoX keeps the leading frames
        when t is even)
    """

    def __init__(self, variant: str | TAEHVArgs = "taehv", **overrides):
        """A public variant by name (with overrides), or any construction arguments (a variant
        built for a reference VAE by models/vae_geometry.py, read back from model_info.json)."""
        super().__init__()
        self.args = check_args(replace(variant, **overrides)) if isinstance(variant, TAEHVArgs) else resolve_args(variant, **overrides)
        self.encoder = build_encoder(self.args)
        build_decoder = build_super_decoder if self.args.decoder_kind == "super" else build_base_decoder
        self.decoder = build_decoder(self.args)
        self.gradient_checkpointing = False
        self.set_fast_path()
        self._init_for_training_from_scratch()

    def _init_for_training_from_scratch(self) -> None:
        """PyTorch's default conv init shrinks the signal ~6x per layer, so through ~40 layers the
        encoder's gradients fall to ~1e-7 (Adam's eps) and training from scratch stalls at a grey
        output. He init keeps the signal level; residual branches and the output layer start small
        so the sum stays stable, and the output starts at mid-grey. Loading weights overwrites all."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, MEMORY_BLOCKS):
                module.conv[-1].weight.data.mul_(0.2)
        self.decoder[-1].weight.data.mul_(0.05)
        nn.init.constant_(self.decoder[-1].bias, 0.5)

    # public attributes used by scripts and users
    @property
    def variant(self) -> str:
        return self.args.variant

    @property
    def patch_size(self) -> int:
        return self.args.patch_size

    @property
    def latent_channels(self) -> int:
        return self.args.latent_channels

    @property
    def t_downscale(self) -> int:
        return self.args.t_downscale

    @property
    def t_upscale(self) -> int:
        return self.args.t_upscale

    @property
    def frames_to_trim(self) -> int:
        return self.args.frames_to_trim

    @property
    def spatial_downscale(self) -> int:
        return self.args.spatial_downscale

    def set_gradient_checkpointing(self, enabled: bool = True) -> "TAEHV":
        """Recompute activations in backward (parallel mode, training only): less memory, same values."""
        self.gradient_checkpointing = enabled
        return self

    def set_fast_path(self, channels_last: bool = False, compile_backend: str = "") -> "TAEHV":
        """Parallel encode/decode with NHWC activations and/or through torch.compile (backend name,
        '' = eager). Same values to float rounding; the weights and their names do not change, so
        checkpoints and exports are unaffected. The sequential (streaming) path stays eager."""
        self.channels_last = channels_last
        self.parallel_runner = torch.compile(run_parallel, backend=compile_backend) if compile_backend else run_parallel
        return self

    # frame bookkeeping (TAEHVArgs holds the arithmetic; see the module docstring) ----------------
    def latent_frame_count(self, n_frames: int) -> int:
        return self.args.latent_frame_count(n_frames)

    def trims_leading_frames(self, n_latent_frames: int) -> bool:
        return self.args.trims_leading_frames(n_latent_frames)

    def decoded_frame_count(self, n_latent_frames: int) -> int:
        return self.args.decoded_frame_count(n_latent_frames)

    def frame_rule(self) -> tuple[int, int]:
        return self.args.frame_rule()

    def is_valid_frame_count(self, n_frames: int) -> bool:
        return self.args.is_valid_frame_count(n_frames)

    def valid_frame_counts(self, limit: int) -> list[int]:
        return self.args.valid_frame_counts(limit)

    # encode / decode ---------------------------------------------------------------------------
    def encode_video(self, x: torch.Tensor, parallel: bool = True, show_progress_bar: bool = False) -> torch.Tensor:
        """x: N,T,3,H,W RGB in [0, 1] -> N,t,L,h,w latents, t = `latent_frame_count(T)`. T is padded
        at the end by repeating the last frame (to a multiple of `t_downscale`, or of the chunk);
        H and W must be multiples of 8 x patch size."""
        self._check_video(x)
        x = self._unshuffle(x)
        chunk = self.args.chunk
        if chunk is None:
            return self._run(self.encoder, pad_with_last_frame(x, self.t_downscale), parallel, show_progress_bar)
        chunks = pad_with_last_frame(x, chunk.frames).unflatten(1, (-1, chunk.frames))  # N,m,frames,C,H,W
        chunks = F.pad(chunks, (0, 0, 0, 0, 0, 0, self.args.chunk_lead_frames, 0))  # zero frames in front
        if parallel:  # chunks on the batch axis, so no memory crosses a chunk boundary
            latents = self._run(self.encoder, chunks.flatten(0, 1), True, show_progress_bar)
            latents = latents.unflatten(0, chunks.shape[:2]).flatten(1, 2)
        else:  # one chunk after another, each from empty memory: O(1) memory in T
            latents = torch.cat([run_sequential(self.encoder, chunks[:, i], show_progress_bar) for i in range(chunks.shape[1])], 1)
        return latents[:, : latents.shape[1] - chunk.dropped_latents]

    def decode_video(self, z: torch.Tensor, parallel: bool = True, show_progress_bar: bool = False) -> torch.Tensor:
        """z: N,t,L,h,w unscaled latents -> N,T,3,8ph,8pw RGB in [0, 1], T = `decoded_frame_count(t)`."""
        if z.ndim != 5 or z.shape[2] != self.latent_channels:
            raise ValueError(
                f"decode_video expects N,T,{self.latent_channels},h,w latents for variant {self.variant}, "
                f"got shape {tuple(z.shape)}"
            )
        return self.frames_from_decoder(self._run(self.decoder, z, parallel, show_progress_bar), z.shape[1])

    def frames_from_decoder(self, x: torch.Tensor, n_latent_frames: int) -> torch.Tensor:
        """The decoder's raw output N,T,3p^2,h,w of `n_latent_frames` latents -> the decoded frames
        (pixel shuffle, clamp to [0, 1], leading and chunk trims): the tail of decode_video."""
        x = self._finish_decoded(x)
        chunk = self.args.chunk
        if chunk is None:
            return x[:, self.frames_to_trim :] if self.trims_leading_frames(n_latent_frames) else x
        # one sequence through the decoder (memory carried across chunks), trimmed chunk by chunk
        per_chunk = self.args.chunk_decoded_frames
        x = F.pad(x, (0, 0, 0, 0, 0, 0, 0, -x.shape[1] % per_chunk))  # black frames up to whole chunks
        x = x.unflatten(1, (-1, per_chunk))[:, :, self.frames_to_trim :].flatten(1, 2)
        return x[:, : x.shape[1] - chunk.dropped_latents * self.t_upscale]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Round trip: decode(encode(x))."""
        return self.decode_video(self.encode_video(x))

    def _unshuffle(self, x: torch.Tensor) -> torch.Tensor:
        if self.patch_size == 1:
            return x
        return F.pixel_unshuffle(x.flatten(0, 1), self.patch_size).unflatten(0, x.shape[:2])

    def _finish_decoded(self, x: torch.Tensor) -> torch.Tensor:
        if self.patch_size > 1:
            x = F.pixel_shuffle(x.flatten(0, 1), self.patch_size).unflatten(0, x.shape[:2])
        return x.clamp(0, 1)

    def _run(self, model: nn.Sequential, x: torch.Tensor, parallel: bool, show_progress_bar: bool) -> torch.Tensor:
        if parallel:
            return self.parallel_runner(model, x, use_checkpointing=self.gradient_checkpointing and self.training,
                                        channels_last=self.channels_last)
        return run_sequential(model, x, show_progress_bar)

    def _check_video(self, x: torch.Tensor) -> None:
        multiple = self.spatial_downscale
        if x.ndim != 5 or x.shape[2] != 3:
            raise ValueError(f"encode_video expects N,T,3,H,W RGB in [0, 1], got shape {tuple(x.shape)}")
        if x.shape[-2] % multiple or x.shape[-1] % multiple:
            raise ValueError(
                f"height and width must be multiples of {multiple} for variant {self.variant} "
                f"(8 x patch size {self.patch_size}), got {x.shape[-2]}x{x.shape[-1]}"
            )

    # loading -------------------------------------------------------------------------------------
    @classmethod
    def from_args(cls, args: TAEHVArgs) -> "TAEHV":
        """A fresh model with exactly these construction arguments (e.g. from model_info.json)."""
        return cls(args)

    @classmethod
    def from_pretrained(cls, path: str | Path, variant: str | None = None, **overrides) -> "TAEHV":
        """Load a public-format TAEHV file (.pth or .safetensors).

        With `variant` given, the file must match it. Without, patch size, latent channels,
        decoder kind and time flags come from the tensor shapes, and a `model_info.json` beside the
        file (written by our exports) supplies what shapes cannot tell, such as the CogVideoX
        trim rule. A file whose shapes fit taehv/taecvx/taew2_1/taeos1_3 alike and has no
        model_info.json loads as the variant its public file name names (`taecvx.pth`,
        `taew2_1_ema.safetensors`); with another name, as the generic "taehv" with a warning that
        names variant=. LTX files load likewise as "taeltx2_3" or "taeltx_2" (same shapes; the wide
        decoder is told by its widths). A taeh3 file not named so is refused without variant or
        model_info.json: its chunking changes every frame count and no tensor shows it.
        """
        path = Path(path)
        state_dict = load_state_dict_file(path)
        if variant is None:
            info_args = read_model_info(path)
            args = info_args if info_args is not None else infer_args_from_state_dict(state_dict, path)
            model = cls.from_args(replace(args, **overrides) if overrides else args)
        else:
            model = cls(variant, **overrides)
        model.load_public_state_dict(state_dict, source=str(path))
        return model

    def load_public_state_dict(self, state_dict: dict[str, torch.Tensor], source: str = "state dict") -> None:
        """Strict load with one clear message on mismatch; narrows TGrow weights for disabled time stages."""
        state_dict = narrow_tgrow_weights(self, state_dict)
        expected = {k: tuple(v.shape) for k, v in self.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in state_dict.items()}
        problems = [f"missing {k} {expected[k]}" for k in expected if k not in got]
        problems += [f"unexpected {k} {got[k]}" for k in got if k not in expected]
        problems += [f"{k}: file has {got[k]}, model needs {expected[k]}" for k in expected if k in got and got[k] != expected[k]]
        if problems:
            shown = "; ".join(problems[:4]) + (f"; ... {len(problems) - 4} more" if len(problems) > 4 else "")
            raise ValueError(
                f"{source} does not match TAEHV variant {self.variant!r} "
                f"(patch_size={self.patch_size}, latent_channels={self.latent_channels}, "
                f"decoder={self.args.decoder_kind}): {shown}. Pass the variant the file was trained as."
            )
        self.load_state_dict(state_dict, strict=True)


# --------------------------------------------------------------------------------------------
# File helpers
# --------------------------------------------------------------------------------------------

MODEL_INFO_FILENAME = "model_info.json"


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a .pth or .safetensors TAEHV file, on CPU."""
    if not path.is_file():
        raise FileNotFoundError(f"TAEHV weight file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state_dict = load_file(str(path), device="cpu")
        else:
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated or foreign files raise many different types
        raise ValueError(f"cannot read TAEHV weights from {path}: {error}. Is the file complete?") from error
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(f"{path} is not a plain TAEHV state dict (expected a dict of tensors)")
    return state_dict


def args_metadata(model: TAEHV) -> dict[str, str]:
    """safetensors metadata that makes the file alone say what it is (a variant built for a VAE
    has no name that shapes could tell)."""
    return {"taehv_model_args": json.dumps(model.args.to_json_dict())}


def read_model_info(weights_path: Path) -> TAEHVArgs | None:
    """The construction arguments of model_info.json beside the file, else of the file's own
    safetensors metadata, else None."""
    info_path = weights_path.parent / MODEL_INFO_FILENAME
    if not info_path.is_file():
        if weights_path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(weights_path), "pt") as handle:
                stored = (handle.metadata() or {}).get("taehv_model_args")
            return TAEHVArgs.from_json_dict(json.loads(stored)) if stored else None
        return None
    info = json.loads(info_path.read_text())
    if "model_args" not in info:
        raise ValueError(f"{info_path} has no 'model_args'; delete it or re-export the model")
    return TAEHVArgs.from_json_dict(info["model_args"])


def write_model_info(model: TAEHV, directory: Path, **extra) -> Path:
    """model_info.json: the construction arguments plus any extra fields (step, metrics, ...)."""
    path = Path(directory) / MODEL_INFO_FILENAME
    path.write_text(json.dumps({"model_args": model.args.to_json_dict(), **extra}, indent=2))
    return path


def infer_args_from_state_dict(state_dict: dict[str, torch.Tensor], source: Path | str = "file") -> TAEHVArgs:
    """Construction arguments from tensor shapes alone (see `TAEHV.from_pretrained`)."""
    # "encoder.<i>.conv.weight" (no sub-index) is a TPool, "decoder.<i>.conv.weight" a TGrow: their
    # 1x1 weights are [c, s*c] and [s*c, c], so the time strides need no channel table.
    def time_weights(part: str) -> list[torch.Tensor]:
        found = [(int(m.group(1)), v) for k, v in state_dict.items() if (m := re.fullmatch(rf"{part}\.(\d+)\.conv\.weight", k))]
        return [v for _, v in sorted(found, key=lambda item: item[0])]

    pools, grows = time_weights("encoder"), time_weights("decoder")
    if len(pools) != 3 or len(grows) != 3:
        raise ValueError(f"{source} is not a TAEHV state dict: it has {len(pools)} TPool and {len(grows)} TGrow weights, not 3 and 3")
    try:
        patch_size = round((state_dict["encoder.0.weight"].shape[1] // 3) ** 0.5)
        latent_channels = state_dict["encoder.17.weight"].shape[0]
        if "decoder.0.weight" in state_dict:  # the base layout starts with a parameter-free Clamp
            decoder_kind = "super"
        else:
            width = state_dict["decoder.1.weight"].shape[0]
            kinds = [kind for kind, widths in BASE_LAYOUT_WIDTHS.items() if widths[0] == width]
            if not kinds:
                raise ValueError(f"{source}: first decoder stage has {width} channels, no TAEHV decoder kind has that")
            decoder_kind = kinds[0]
    except KeyError as error:
        raise ValueError(f"{source} is not a TAEHV state dict: key {error} is missing") from error
    encoder_time = tuple(w.shape[1] == 2 * w.shape[0] for w in pools)
    decoder_time = tuple(w.shape[0] == 2 * w.shape[1] for w in grows)
    matches = [a for a in VARIANTS.values() if (a.patch_size, a.latent_channels, a.decoder_kind) == (patch_size, latent_channels, decoder_kind)]
    if not matches:
        raise ValueError(
            f"{source}: no known TAEHV variant has patch_size={patch_size}, latent_channels={latent_channels}, "
            f"decoder={decoder_kind}; pass variant=... and overrides explicitly"
        )
    named = variant_named_by_file(source, [a.variant for a in matches])
    if named is not None:
        chosen = VARIANTS[named]
    else:
        chunked = [a.variant for a in matches if a.chunk is not None]
        if chunked:  # guessing would silently change every frame count
            raise ValueError(
                f"{source}: patch_size={patch_size}, latent_channels={latent_channels} is variant {chunked[0]!r}, whose "
                f"time chunking no tensor shows: pass variant={chunked[0]!r} or keep {MODEL_INFO_FILENAME} beside the file"
            )
        chosen = matches[0]
        if len(matches) > 1:  # e.g. taecvx loaded as taehv would lose the CogVideoX trim rule: say so
            other_rules = [a.variant for a in matches if a.frame_rule() != chosen.frame_rule()]
            warnings.warn(
                f"{source}: its shapes fit {', '.join(a.variant for a in matches)} alike and neither its file name nor a "
                f"{MODEL_INFO_FILENAME} beside it says which: loaded as {chosen.variant!r}"
                + (f" ({', '.join(other_rules)} would decode other frame counts)" if other_rules else "")
                + "; if it is another, pass variant=... (inference.py: --variant)",
                stacklevel=3,
            )
    return replace(chosen, encoder_time_downscale=encoder_time, decoder_time_upscale=decoder_time)


# Our exports are named taehv.pth whatever their variant, so that name alone tells nothing.
EXPORT_FILE_STEM = "taehv"


def variant_named_by_file(path: Path | str, candidates: list[str]) -> str | None:
    """The candidate a public file name names: its stem is the variant, alone or followed by a
    separator (`taecvx.pth`, `taew2_1.safetensors`, `taecvx_ema.pth`); the longest such name wins."""
    stem = Path(str(path)).name.split(".")[0].lower()
    named = [v for v in candidates if v != EXPORT_FILE_STEM and (stem == v or (stem.startswith(v) and stem[len(v)] in "_-"))]
    return max(named, key=len) if named else None


def narrow_tgrow_weights(model: TAEHV, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint trained with time upscaling, loaded where that TGrow is disabled: keep the
    output channels of the last time step (they are what a stride-1 TGrow would emit)."""
    target = model.state_dict()
    narrowed = dict(state_dict)
    for name, module in model.named_modules():
        if isinstance(module, TGrow) and module.stride == 1:
            key = f"{name}.conv.weight"
            if key in state_dict and key in target:
                have, want = state_dict[key].shape[0], target[key].shape[0]
                if have > want and have % want == 0:
                    narrowed[key] = state_dict[key][-want:]
    return narrowed


# --------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------


_NEW_CHUNK = object()  # marker in the encoder's queue: the next frames start a chunk from empty memory


class _StreamPart:
    """The encoder or decoder side of a stream: queued inputs, and the lazily computed outputs of
    the input being processed, so each call does only the work its one result needs."""

    def __init__(self, model: nn.Sequential):
        self.model = model
        self.runner = SequentialRunner(model)
        self.queue: deque = deque()
        self.outputs: Iterator[torch.Tensor] = iter(())

    def next_output(self) -> torch.Tensor | None:
        while (output := next(self.outputs, None)) is None:
            if not self.queue:
                return None
            item = self.queue.popleft()
            if item is _NEW_CHUNK:
                self.runner = SequentialRunner(self.model)
            else:
                self.outputs = self.runner.outputs(item)
        return output


class StreamingTAEHV:
    """Upstream's streaming API: frames or latents go in as they arrive, one result comes out per
    call, with O(1) memory in T and only the decoder work the returned frame needs.

    Encode then decode (video to video):
        stream = StreamingTAEHV(model)
        for frame in frames:                        # frame: N,1,3,H,W in [0, 1] (any T works)
            latent = stream.encode(frame)           # N,1,L,h,w once t_downscale frames are in, else None
            decoded = stream.decode(latent)         # queues the latent (if any), returns the next frame or None
        remaining = stream.flush()                  # pads the encoder input, returns the last frames

    Decode only (e.g. a world model producing latents):
        frame = stream.decode(latent)               # N,1,3,H,W: the first frame of this latent
        while frame is not None:
            show(frame)
            frame = stream.decode()                 # the latent's other frames, one per call

    The results equal `encode_video` / `decode_video`, with these streaming limits: CogVideoX-rule
    models trim the leading frames only when `num_latent_frames` says the count is odd (upstream
    never trims them while streaming); chunked models (taeh3) drop the first frames of every chunk
    as decode_video does, but cannot drop or pad the end: for 5n+2 latents (the H3 rule) the frames
    are the same, for other counts the end differs. Call `reset()` before a new stream.
    """

    def __init__(self, taehv: "TAEHV", num_latent_frames: int | None = None):
        self.taehv = taehv
        self.trims_leading_frames = (
            taehv.args.trim_leading_frames and not taehv.args.cogvideox_trim_rule if num_latent_frames is None
            else taehv.trims_leading_frames(num_latent_frames)
        )
        self.reset()

    def reset(self) -> None:
        """Forget all state: the next frame or latent starts a new stream."""
        self._encoder = _StreamPart(self.taehv.encoder)
        self._decoder = _StreamPart(self.taehv.decoder)
        self._held_latents: deque = deque()  # chunked models: the clip's last latents get dropped
        self._last_frame: torch.Tensor | None = None
        self.n_frames_encoded = 0  # frames queued for the encoder, end padding included
        self.n_frames_decoded = 0  # decoder outputs, trimmed ones included

    @torch.no_grad()
    def encode(self, x: torch.Tensor | None = None) -> torch.Tensor | None:
        """Queue frames x (N,T,3,H,W in [0, 1], optional) and return the next latent (N,1,L,h,w), or
        None when more input is needed."""
        if x is not None:
            self.taehv._check_video(x)
            for frame in self.taehv._unshuffle(x).unbind(1):
                self._queue_frame(frame)
        chunk = self.taehv.args.chunk
        while (latent := self._encoder.next_output()) is not None:
            if chunk is None:
                return latent[:, None]
            self._held_latents.append(latent)  # released once it cannot be one of the clip's last
            if len(self._held_latents) > chunk.dropped_latents:
                return self._held_latents.popleft()[:, None]
        return None

    @torch.no_grad()
    def decode(self, x: torch.Tensor | None = None) -> torch.Tensor | None:
        """Queue latents x (N,T,L,h,w, optional) and return the next decoded frame (N,1,3,H,W in
        [0, 1]), or None when the queue is empty. Trimmed frames are never returned."""
        if x is not None:
            if x.ndim != 5 or x.shape[2] != self.taehv.latent_channels:
                raise ValueError(f"decode expects N,T,{self.taehv.latent_channels},h,w latents, got shape {tuple(x.shape)}")
            self._decoder.queue.extend(x.unbind(1))
        while (raw := self._decoder.next_output()) is not None:
            index = self.n_frames_decoded
            self.n_frames_decoded += 1
            if not self._is_trimmed(index):
                return self.taehv._finish_decoded(raw[:, None])
        return None

    def flush_encoder(self) -> list[torch.Tensor]:
        """End of input: pad with the last frame as encode_video does, return the remaining latents."""
        chunk = self.taehv.args.chunk
        if self._last_frame is not None:
            for _ in range(-self.n_frames_encoded % (chunk.frames if chunk else self.taehv.t_downscale)):
                self._queue_frame(self._last_frame)
        latents = []
        while (latent := self.encode()) is not None:
            latents.append(latent)
        self._held_latents.clear()  # chunked: dropped, as encode_video and the H3 VAE do
        return latents

    def flush_decoder(self) -> list[torch.Tensor]:
        """All frames of the latents queued so far."""
        frames = []
        while (frame := self.decode()) is not None:
            frames.append(frame)
        return frames

    def flush(self) -> list[torch.Tensor]:
        """End of a video-to-video stream: the remaining latents decoded, as a list of frames."""
        frames = [frame for latent in self.flush_encoder() if (frame := self.decode(latent)) is not None]
        return frames + self.flush_decoder()

    def _queue_frame(self, frame: torch.Tensor) -> None:
        args = self.taehv.args
        if args.chunk is not None and self.n_frames_encoded % args.chunk.frames == 0:
            self._encoder.queue.append(_NEW_CHUNK)
            self._encoder.queue.extend([torch.zeros_like(frame)] * args.chunk_lead_frames)
        self._encoder.queue.append(frame)
        self._last_frame = frame
        self.n_frames_encoded += 1

    def _is_trimmed(self, index: int) -> bool:
        args = self.taehv.args
        if args.chunk is not None:
            return index % args.chunk_decoded_frames < args.frames_to_trim
        return self.trims_leading_frames and index < args.frames_to_trim


class FrameStreamer:
    """This project's earlier streaming API (list-returning, single 4-D frames), on StreamingTAEHV.

    encode(frame N,3,H,W) -> list of latents (N,L,h,w) completed by this frame (0 or 1 items);
    flush() -> the last latent(s), padding pending frames with the last frame as encode_video does;
    decode(latent N,L,h,w) -> list of all decoded frames (N,3,H,W) it completes, trimmed as in
    decode_video. CogVideoX-rule models need `num_latent_frames` to know whether to trim.
    """

    def __init__(self, model: "TAEHV", num_latent_frames: int | None = None):
        if model.args.cogvideox_trim_rule and num_latent_frames is None:
            raise ValueError(
                f"variant {model.variant} trims decoded frames only for an odd latent count: "
                "pass num_latent_frames to FrameStreamer"
            )
        self.model = model
        self.stream = StreamingTAEHV(model, num_latent_frames)

    def encode(self, frame: torch.Tensor) -> list[torch.Tensor]:
        latents, latent = [], self.stream.encode(frame[:, None])
        while latent is not None:
            latents.append(latent[:, 0])
            latent = self.stream.encode()
        return latents

    def flush(self) -> list[torch.Tensor]:
        return [latent[:, 0] for latent in self.stream.flush_encoder()]

    def decode(self, latent: torch.Tensor) -> list[torch.Tensor]:
        frames, frame = [], self.stream.decode(latent[:, None])
        while frame is not None:
            frames.append(frame[:, 0])
            frame = self.stream.decode()
        return frames


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

