"""Reference VAEs the student is distilled from, diffusers classes behind one interface in our
conventions (videos N,T,3,H,W in [0, 1], latents N,t,C,h,w in the family's latent space):
cogvideox AutoencoderKLCogVideoX, hunyuan AutoencoderKLHunyuanVideo, hunyuan1_5
AutoencoderKLHunyuanVideo15, wan AutoencoderKLWan (2.1, or 2.2's 48-channel patch-2 layout, from
its config), ltx AutoencoderKLLTXVideo, ltx2 AutoencoderKLLTX2Video, minimax_h3
AutoencoderKLMiniMaxH3 (ImageNet-normalised pixels).

Latent spaces. The student must learn the space the public TAEHV weights of its family work in,
or fine-tuning them trains toward another target than the one they start from and serve. Each
space is a per-channel map of the VAE's raw latents, z = (raw - shift) * scale (decode inverts it):
  raw         shift 0, scale 1
  scaled      shift 0, scale = the VAE config's scaling_factor (what CogVideoX and HunyuanVideo
              pipelines hand their transformer)
  normalized  shift = latents_mean, scale = 1 / latents_std of the VAE config (what the Wan
              pipelines hand theirs)
Defaults (`ref_vae_latent_space=auto`), with the evidence (../shared/reference/README.md):
  cogvideox  raw: the public TAECVX demo divides the CogVideoX pipeline's latents by its scaling
             factor before decoding them with TAECVX.
  wan        normalized: the public TAEW2.1/TAEW2.2 demos plug TAEHV into the Wan pipeline with
             latents_mean=0 and latents_std=1, so TAEHV decodes (raw - mean) / std; upstream's
             example Wan latents have RMS 0.94 and channel means near 0 (raw ones do not).
  hunyuan, hunyuan1_5  scaled: not stated upstream; the space their pipelines hand the transformer.
  ltx, ltx2, minimax_h3  normalized: not stated upstream; the space their pipelines hand the
             transformer (LTX: (raw - latents_mean) * scaling_factor / latents_std, its statistics
             being buffers of the VAE; MiniMax H3: (raw - latents_mean) / latents_std of its config).

Frame alignment, measured on each class: for the valid input counts below, t latents decode to
the same T frames that went in, decoded frame j showing input frame j, and the student's
encode gives the same t. CogVideoX decodes t latents into 4t frames when t is even (13 frames in,
16 out), so it needs an odd t: 8k+1 frames (9, 17, ..., 49).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from models import vae_geometry

# plain data, importable without torch (the launcher's config check reads them there)
from models.reference_families import (
    FAMILIES,
    FAMILY,
    IMAGENET_MEAN,
    IMAGENET_STD,
    is_valid_frame_count,
    resolve_latent_space,
)
from models.vae_geometry import VAEGeometry, decoded_frames, latent_of
from models.variants import VARIANTS, TAEHVArgs


def latent_space_transform(vae: nn.Module, space: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift, scale), each of the VAE's latent-channel count, from its diffusers config (LTX and
    LTX-2 keep latents_mean/std as buffers and also apply their scaling_factor, as their pipelines do)."""
    config = vae.config
    channels = config.get("latent_channels") or config.get("z_dim") or config.get("z_channels") or 1  # 1 broadcasts
    shift, scale = torch.zeros(channels), torch.ones(channels)
    buffers = dict(vae.named_buffers())
    if space == "scaled":
        scale = scale * float(config["scaling_factor"])
    elif space == "normalized" and "latents_mean" in buffers:
        shift = buffers["latents_mean"].detach().float().cpu()
        scale = float(config.get("scaling_factor", 1.0)) / buffers["latents_std"].detach().float().cpu()
    elif space == "normalized":
        shift = torch.tensor(config["latents_mean"], dtype=torch.float32)
        scale = 1 / torch.tensor(config["latents_std"], dtype=torch.float32)
    return shift, scale


def vae_class(family: str, geometry: VAEGeometry | None = None):
    """The diffusers class of a named family, or the measured class of any other VAE."""
    import diffusers

    return getattr(diffusers, geometry.class_name if geometry is not None else FAMILY[family].vae_class)


def reference_architecture(family: str, geometry: VAEGeometry | None = None, path: str = "") -> nn.Module:
    """The reference VAE with random weights, for counting FLOPs and memory: a named family's
    published architecture (its class's default config), a measured VAE's own config.json."""
    if geometry is None:
        return vae_class(family)().eval()
    return vae_geometry.build_vae(vae_geometry.read_vae_config(path))


WAN_FRAMES_PER_PASS = 8  # diffusers' Wan encode takes 4; twice that at most doubles its working memory


def encodes_in_fewer_passes(vae: nn.Module) -> bool:
    """Whether wan_encode_in_fewer_passes applies: diffusers' AutoencoderKLWan whose own encode runs
    its encoder on 4 frames at a time with the cache that function drives (read from its source
    once: another diffusers keeps its own encode)."""
    import inspect

    if type(vae).__name__ != "AutoencoderKLWan":
        return False
    try:
        return "_enc_feat_map" in inspect.getsource(type(vae)._encode)
    except (OSError, TypeError, AttributeError):  # no source installed (bytecode only), or no _encode
        return False


def wan_encode_in_fewer_passes(vae: nn.Module, x: torch.Tensor):
    """AutoencoderKLWan.encode with its encoder run on the first frame, then on WAN_FRAMES_PER_PASS
    frames at a time, where diffusers' _encode takes 4 after the first. The same latents: across
    passes only the causal convolutions (their last 2 input frames) and the time downsampling (its
    last frame, stride 2 over a multiple of 4 frames) carry state, and one convolution over more
    frames reads the same windows; the norms, attention and spatial layers work per frame. The
    first frame stays alone: its pass skips the time downsampling. Fewer, larger kernels (2 passes
    where diffusers makes 3 at 9 frames, 3 for 5 at 17); the plan measures the larger working memory
    (training/plan/memory.py), and ref_vae_tiling=true keeps diffusers' own pieces."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import patchify
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution
    from diffusers.models.modeling_outputs import AutoencoderKLOutput

    frames = 1 + 4 * ((x.shape[2] - 1) // 4)  # as diffusers: the frames past its last 4-frame piece are left out
    vae.clear_cache()
    if vae.config.patch_size is not None:
        x = patchify(x, patch_size=vae.config.patch_size)  # spatial: the frames stay
    outputs = []
    for start, end in [(0, 1), *((s, min(s + WAN_FRAMES_PER_PASS, frames)) for s in range(1, frames, WAN_FRAMES_PER_PASS))]:
        vae._enc_conv_idx = [0]
        outputs.append(vae.encoder(x[:, :, start:end], feat_cache=vae._enc_feat_map, feat_idx=vae._enc_conv_idx))
    moments = vae.quant_conv(torch.cat(outputs, 2))
    vae.clear_cache()
    return AutoencoderKLOutput(latent_dist=DiagonalGaussianDistribution(moments))


class ReferenceVAE(nn.Module):
    """Frozen diffusers video VAE. encode: N,T,3,H,W [0, 1] -> N,t,C,h,w; decode: the reverse.
    `family` is one of FAMILIES, or the class name of a VAE measured into `geometry`
    (models/vae_geometry.py)."""

    def __init__(self, vae: nn.Module, family: str, sample_latents: bool = True, latent_space: str = "auto",
                 geometry: VAEGeometry | None = None):
        super().__init__()
        if family not in FAMILIES and geometry is None:
            raise ValueError(f"unknown reference VAE family {family!r}; choose one of {', '.join(FAMILIES)}")
        self.vae = vae.eval().requires_grad_(False)
        self.family = family
        self.geometry = geometry
        self.imagenet_pixels = family in FAMILY and FAMILY[family].imagenet_pixels  # MiniMax H3
        # a measured VAE's frame rule, worked out once: (m, r, the smallest count) of counts m*k + r
        self._measured_rule = None
        if geometry is not None:
            student = vae_geometry.student_for(geometry)[0]
            self._measured_rule = (*vae_geometry.frame_rule(geometry, student), vae_geometry.agreeing_counts(geometry, student)[0])
        self.sample_latents = sample_latents
        self.memory_format = torch.contiguous_format  # set_channels_last() changes it
        self.compiled_encode = None  # compile_encode() sets it
        self.fewer_passes = encodes_in_fewer_passes(vae)
        self.latent_space = (vae_geometry.resolve_latent_space(geometry, latent_space) if geometry is not None
                             else resolve_latent_space(family, latent_space))
        shift, scale = latent_space_transform(vae, self.latent_space)
        device = next(vae.parameters()).device
        self.register_buffer("shift", shift.view(1, 1, -1, 1, 1).to(device), persistent=False)  # over N,t,C,h,w
        self.register_buffer("scale", scale.view(1, 1, -1, 1, 1).to(device), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    @torch.no_grad()
    def encode(self, video: torch.Tensor, generator: torch.Generator | None = None, check: bool = True) -> torch.Tensor:
        """check=False leaves the finiteness test to the caller (the training step folds it into its
        one agreement instead of waiting for the GPU here); nonfinite_message() says what failed."""
        distribution = self._latent_dist(video)
        latents = distribution.sample(generator) if self.sample_latents else latent_of(distribution)
        latents = self._checked(latents) if check else self._layout(latents)
        return (latents - self.shift) * self.scale

    @torch.no_grad()
    def encode_distribution(self, video: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log-variance) of the latent distribution in the latent space, each N,t,C,h,w fp32
        (for the latent cache); the per-channel scale multiplies the variance by scale^2."""
        distribution = self._latent_dist(video)
        mean = (self._checked(latent_of(distribution)) - self.shift) * self.scale
        # a deterministic encoder (Cosmos) has no variance: a log-variance far below any sample's
        logvar = distribution.logvar if hasattr(distribution, "logvar") else torch.full_like(distribution.mode(), -60.0)
        return mean, self._checked(logvar) + 2 * self.scale.abs().log()

    def takes_frame_count(self, n_frames: int) -> bool:
        if self._measured_rule is None:
            return is_valid_frame_count(self.family, n_frames)
        modulus, remainder, first = self._measured_rule
        return n_frames >= first and n_frames % modulus == remainder

    def valid_frame_counts(self, limit: int = 50) -> list[int]:
        return [n for n in range(1, limit) if self.takes_frame_count(n)]

    def set_channels_last(self) -> "ReferenceVAE":
        """The 3-D convolutions' weights and the input in channels_last_3d (NDHWC), the layout cuDNN's
        fastest 3-D kernels take on recent GPUs (ref_vae_channels_last; make gpu-check times both)."""
        self.memory_format = torch.channels_last_3d
        for parameter in self.vae.parameters():
            if parameter.dim() == 5:
                parameter.data = parameter.data.contiguous(memory_format=torch.channels_last_3d)
        return self

    def compile_encode(self, backend: str) -> "ReferenceVAE":
        """The VAE's own encode through torch.compile (ref_vae_compile): the first encode of each shape
        compiles; the pixel conversion, the latent sample with its generator and the checks stay eager."""
        self.compiled_encode = torch.compile(self._vae_encode, backend=backend)
        return self

    def _latent_dist(self, video: torch.Tensor):
        if not self.takes_frame_count(video.shape[1]):
            raise ValueError(f"{video.shape[1]} frames do not suit the {self.family} VAE: use one of "
                             f"{self.valid_frame_counts(50)}")
        x = self._to_vae_pixels(video.permute(0, 2, 1, 3, 4))  # N,C,T,H,W in the VAE's pixel convention
        return (self.compiled_encode or self._vae_encode)(x.to(self.dtype).contiguous(memory_format=self.memory_format)).latent_dist

    def _vae_encode(self, x: torch.Tensor):
        """The VAE's encode; a Wan VAE's in fewer passes (wan_encode_in_fewer_passes) unless tiling
        or slicing asks for diffusers' own smaller pieces."""
        vae = self.vae
        if self.fewer_passes and not vae.use_tiling and not (vae.use_slicing and x.shape[0] > 1):
            return wan_encode_in_fewer_passes(vae, x)
        return vae.encode(x)

    def _to_vae_pixels(self, frames: torch.Tensor) -> torch.Tensor:
        """N,C,T,H,W in [0, 1] -> [-1, 1], or ImageNet-normalised for MiniMax H3."""
        if self.imagenet_pixels:
            mean = frames.new_tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
            return (frames - mean) / frames.new_tensor(IMAGENET_STD).view(1, 3, 1, 1, 1)
        return frames * 2 - 1

    def _from_vae_pixels(self, frames: torch.Tensor) -> torch.Tensor:
        if self.imagenet_pixels:
            mean = frames.new_tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)
            return (frames * frames.new_tensor(IMAGENET_STD).view(1, 3, 1, 1, 1) + mean).clamp(0, 1)
        return ((frames + 1) / 2).clamp(0, 1)

    @staticmethod
    def _layout(latents: torch.Tensor) -> torch.Tensor:
        return latents.float().permute(0, 2, 1, 3, 4).contiguous()

    def _checked(self, latents: torch.Tensor) -> torch.Tensor:
        latents = self._layout(latents)
        if not torch.isfinite(latents).all():
            raise FloatingPointError(self.nonfinite_message())
        return latents

    def nonfinite_message(self) -> str:
        return (f"the {self.family} reference VAE produced non-finite latents "
                "(check its weights and dtype; bf16 overflow shows up here)")

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents in the latent space (N,t,C,h,w) -> frames N,T,3,H,W in [0, 1]."""
        raw = latents.float() / self.scale + self.shift
        x = raw.permute(0, 2, 1, 3, 4).to(self.dtype)
        if self.vae.config.get("timestep_conditioning"):  # LTX decoders: timestep 0, as their pipelines decode
            frames = self.vae.decode(x, temb=torch.zeros(x.shape[0], device=x.device, dtype=x.dtype)).sample
        else:
            frames = decoded_frames(self.vae.decode(x), self.geometry is not None and self.geometry.frames_first_decode)
        return self._from_vae_pixels(frames.float()).permute(0, 2, 1, 3, 4).contiguous()


STATISTICS = ("latents_mean", "latents_std")  # LTX and LTX-2 keep them as buffers, saved with the weights


def _from_pretrained(cls, dtype: torch.dtype, *where, **options) -> nn.Module:
    """cls.from_pretrained in `dtype`, the latent statistics kept in fp32: torch_dtype=bf16 casts
    every floating buffer, and bf16 statistics move the latent space's shift and scale by up to
    0.4% each (8 significant bits), so reference latents would depend on the device (bf16 on a
    GPU, fp32 on the CPU). They are read again from an fp32 load (only LTX VAEs below fp32 pay it);
    the VAE's own forward never reads them."""
    vae = cls.from_pretrained(*where, torch_dtype=dtype, **options)
    rounded = [name for name, buffer in vae.named_buffers(recurse=False)
               if name in STATISTICS and buffer.dtype != torch.float32]
    if rounded:
        exact = dict(cls.from_pretrained(*where, torch_dtype=torch.float32, **options).named_buffers(recurse=False))
        for name in rounded:
            vae.register_buffer(name, exact[name].detach().clone())
    return vae


def load_reference_vae(family: str, path_or_id: str, device: torch.device, sample_latents: bool = True,
                       tiling: bool = False, dtype: torch.dtype | None = None, latent_space: str = "auto",
                       geometry: VAEGeometry | None = None, xformers: bool = False,
                       channels_last: bool = False) -> ReferenceVAE:
    """From a local folder (a diffusers pipeline folder with vae/, or a VAE folder itself) or a hub
    id (subfolder vae). bf16 on GPU, fp32 on CPU unless `dtype` says otherwise; the latent
    statistics and the normalisation stay fp32 on every device. Any failure is an error that
    names the path: training never switches to another loss on its own. A measured VAE
    (`geometry`) is loaded as its class and tiled when it encodes only tiled."""
    cls = vae_class(family, geometry)
    tiling = tiling or (geometry is not None and geometry.needs_tiling)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    local = Path(path_or_id)
    try:
        if local.is_dir():
            folder = local / "vae" if (local / "vae" / "config.json").is_file() else local
            vae = _from_pretrained(cls, dtype, str(folder))
        else:
            vae = _from_pretrained(cls, dtype, path_or_id, subfolder="vae")
    except Exception as error:
        raise RuntimeError(f"cannot load the {family} reference VAE from {path_or_id!r}: {error}") from error
    vae.to(device)
    if tiling and hasattr(vae, "enable_tiling"):
        vae.enable_tiling()
    if xformers:  # asked for (ref_vae_xformers): PyTorch's SDPA is the default until a GPU measures a gain
        try:
            vae.enable_xformers_memory_efficient_attention()
        except Exception as error:
            raise RuntimeError(f"ref_vae_xformers=true but xformers attention cannot be used ({error}): "
                               "pip install -r requirements-gpu-extras.txt on a GPU machine, or set ref_vae_xformers=false") from None
    reference = ReferenceVAE(vae, family, sample_latents, latent_space, geometry)
    return reference.set_channels_last() if channels_last else reference


def _statistics(channels: int) -> tuple[list[float], list[float]]:
    """Per-channel latents_mean / latents_std far from 0 and 1, so tests tell the spaces apart."""
    return [0.3 * ((i % 7) - 3) for i in range(channels)], [0.5 + 0.25 * (i % 5) for i in range(channels)]


def tiny_reference_vae_config(family: str, wan_layout: str = "2.1") -> dict:
    """A small configuration of the real class (0.1-2.2 M parameters), for tests and the CPU;
    `wan_layout="2.2"` gives Wan 2.2's 48-channel, patch-2 layout."""
    if family == "cogvideox":
        return dict(down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
                    block_out_channels=(8, 8, 16, 16), latent_channels=16, layers_per_block=1, norm_num_groups=4,
                    temporal_compression_ratio=4)
    if family == "hunyuan":
        return dict(down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4,
                    block_out_channels=(8, 8, 16, 16), latent_channels=16, layers_per_block=1, norm_num_groups=4,
                    mid_block_add_attention=False)
    if family == "hunyuan1_5":  # 16x: five widths; the last a multiple of 2 x latent channels
        return dict(block_out_channels=(8, 8, 16, 16, 64), layers_per_block=1, latent_channels=32)
    if family == "wan" and wan_layout == "2.2":
        mean, std = _statistics(48)
        return dict(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                    temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
                    patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4, latents_mean=mean, latents_std=std)
    if family == "wan":
        return dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                    temperal_downsample=[False, True, True])
    if family == "ltx":
        return dict(block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
                    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1), latent_channels=128)
    if family == "ltx2":
        return dict(block_out_channels=(8, 16, 32, 64), decoder_block_out_channels=(8, 16, 32),
                    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1), latent_channels=128)
    if family == "minimax_h3":
        mean, std = _statistics(24)
        return dict(block_out_channels=(8, 8, 16, 16), spatial_downsample_factors=(2, 2, 2, 2),
                    temporal_downsample_factors=(1, 2, 2, 1), layers_per_block=1, norm_num_groups=4, decoder_num_layers=1,
                    decoder_num_attention_heads=1, decoder_attention_head_dim=16, decoder_num_register_tokens=1,
                    decoder_ffn_mult=1, latents_mean=mean, latents_std=std)
    raise ValueError(f"unknown reference VAE family {family!r}; choose one of {', '.join(FAMILIES)}")


def tiny_reference_vae(family: str, wan_layout: str = "2.1") -> nn.Module:
    """The real class at tiny_reference_vae_config, with LTX's latents_mean/std buffers (saved
    with the weights) set far from 0 and 1 as well."""
    vae = vae_class(family)(**tiny_reference_vae_config(family, wan_layout))
    buffers = dict(vae.named_buffers())
    if "latents_mean" in buffers:
        mean, std = _statistics(buffers["latents_mean"].numel())
        buffers["latents_mean"].copy_(torch.tensor(mean))
        buffers["latents_std"].copy_(torch.tensor(std))
    return vae.eval()


@torch.no_grad()
def student_fit_problem(reference: ReferenceVAE, student: TAEHVArgs | str) -> str:
    """'' when the student (its arguments, or a variant's name) gives latents of the reference's
    shape; else one line naming the variants that fit. Measured: one small encode (64x64, the
    smallest valid clip of 2+ latents)."""
    student = VARIANTS[student] if isinstance(student, str) else student
    frames = next(n for n in reference.valid_frame_counts(64) if n > 1)
    side = 64
    device = reference.shift.device
    latents = reference.encode(torch.full((1, frames, 3, side, side), 0.5, device=device))
    _, t, channels, h, _ = latents.shape

    def fits(args: TAEHVArgs) -> bool:
        return (args.latent_channels, 8 * args.patch_size, args.latent_frame_count(frames)) == (channels, side // h, t)

    if fits(student):
        return ""
    matching = [name for name, public in VARIANTS.items() if fits(public)]
    return (f"model_variant={student.variant} gives {student.latent_channels} latent channels, {8 * student.patch_size}x spatial and "
            f"{student.latent_frame_count(frames)} latent frames for {frames} frames, but this {reference.family} VAE gives "
            f"{channels}, {side // h}x and {t}: use model_variant=auto{' or ' + ' or '.join(matching) if matching else ''}")
