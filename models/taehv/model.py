"""The TAEHV module: construction from arguments, frame bookkeeping, encode / decode, loading."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.taehv.blocks import MEMORY_BLOCKS, build_base_decoder, build_encoder, build_super_decoder
from models.taehv.runners import pad_with_last_frame, run_parallel, run_sequential
from models.taehv.weights import infer_args_from_state_dict, load_state_dict_file, narrow_tgrow_weights, read_model_info
from models.variants import TAEHVArgs, check_args, export_in, resolve_args


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

    def weights_to_channels_last(self) -> "TAEHV":
        """The convolutions' weights in NHWC, the layout of channels_last activations: else cuDNN
        converts each weight in every forward and autograd copies each gradient back to NCHW. Values
        and names do not change. Not for a DeepSpeed engine, which views each parameter as bytes
        (NCHW only) and flattens them anyway."""
        return self.to(memory_format=torch.channels_last)

    # frame bookkeeping (TAEHVArgs holds the arithmetic; see the package docstring) ----------------
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
        """Load a public-format TAEHV file (.pth or .safetensors), or the one an export folder holds.

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
        if path.is_dir():  # an export folder (final/, best_model/): the weight file it holds
            found = export_in(path)
            if found is None:
                raise FileNotFoundError(f"{path} holds no TAEHV weight file (<variant>.safetensors or .pth)")
            path = found
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


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
