"""Reference VAEs the student is distilled from: diffusers AutoencoderKLCogVideoX (cogvideox),
AutoencoderKLHunyuanVideo (hunyuan) and AutoencoderKLWan (wan), behind one interface in our
conventions: videos N,T,3,H,W in [0, 1], latents N,t,C,h,w in the family's latent space.

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
  hunyuan    scaled: not stated upstream; this is the space HunyuanVideo's transformer works in.

Frame alignment, measured on each class: for the valid input counts below, t latents decode to
the same T frames that went in, decoded frame j showing input frame j, and the student's
encode gives the same t. CogVideoX decodes t latents into 4t frames when t is even (13 frames in,
16 out), so it needs an odd t: 8k+1 frames (9, 17, ..., 49).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

FAMILIES = ("cogvideox", "hunyuan", "wan")
# valid frame counts: n % modulus == remainder (and n >= remainder + modulus for at least two latents)
FRAME_RULES = {"cogvideox": (8, 1), "hunyuan": (4, 1), "wan": (4, 1)}


def is_valid_frame_count(family: str, n_frames: int) -> bool:
    modulus, remainder = FRAME_RULES[family]
    return n_frames > modulus and n_frames % modulus == remainder


def valid_frame_counts(family: str, limit: int = 64) -> list[int]:
    return [n for n in range(1, limit) if is_valid_frame_count(family, n)]


LATENT_SPACES = ("raw", "scaled", "normalized")
DEFAULT_LATENT_SPACE = {"cogvideox": "raw", "hunyuan": "scaled", "wan": "normalized"}
# the spaces a family's VAE config can express (CogVideoX and Hunyuan have no latents_mean/std, Wan no scaling_factor)
SUPPORTED_LATENT_SPACES = {"cogvideox": ("raw", "scaled"), "hunyuan": ("raw", "scaled"), "wan": ("raw", "normalized")}


def resolve_latent_space(family: str, choice: str = "auto") -> str:
    """`auto` -> the family's default; an explicit space is checked against what the family supports."""
    space = DEFAULT_LATENT_SPACE[family] if choice == "auto" else choice
    if space not in SUPPORTED_LATENT_SPACES[family]:
        raise ValueError(f"ref_vae_latent_space={choice!r} is not available for the {family} VAE: choose auto or one of "
                         f"{', '.join(SUPPORTED_LATENT_SPACES[family])}")
    return space


def latent_space_transform(vae_config, space: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift, scale), each of the VAE's latent-channel count, from its diffusers config."""
    channels = vae_config.get("latent_channels") or vae_config.get("z_dim")
    shift, scale = torch.zeros(channels), torch.ones(channels)
    if space == "scaled":
        scale = scale * float(vae_config["scaling_factor"])
    elif space == "normalized":
        shift = torch.tensor(vae_config["latents_mean"], dtype=torch.float32)
        scale = 1 / torch.tensor(vae_config["latents_std"], dtype=torch.float32)
    return shift, scale


def vae_class(family: str):
    from diffusers import AutoencoderKLCogVideoX, AutoencoderKLHunyuanVideo, AutoencoderKLWan

    return {"cogvideox": AutoencoderKLCogVideoX, "hunyuan": AutoencoderKLHunyuanVideo, "wan": AutoencoderKLWan}[family]


class ReferenceVAE(nn.Module):
    """Frozen diffusers video VAE. encode: N,T,3,H,W [0, 1] -> N,t,C,h,w; decode: the reverse."""

    def __init__(self, vae: nn.Module, family: str, sample_latents: bool = True, latent_space: str = "auto"):
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f"unknown reference VAE family {family!r}; choose one of {', '.join(FAMILIES)}")
        self.vae = vae.eval().requires_grad_(False)
        self.family = family
        self.sample_latents = sample_latents
        self.latent_space = resolve_latent_space(family, latent_space)
        shift, scale = latent_space_transform(vae.config, self.latent_space)
        device = next(vae.parameters()).device
        self.register_buffer("shift", shift.view(1, 1, -1, 1, 1).to(device), persistent=False)  # over N,t,C,h,w
        self.register_buffer("scale", scale.view(1, 1, -1, 1, 1).to(device), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vae.parameters()).dtype

    @torch.no_grad()
    def encode(self, video: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        distribution = self._latent_dist(video)
        latents = distribution.sample(generator) if self.sample_latents else distribution.mean
        return (self._checked(latents) - self.shift) * self.scale

    @torch.no_grad()
    def encode_distribution(self, video: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log-variance) of the latent distribution in the latent space, each N,t,C,h,w fp32
        (for the latent cache); the per-channel scale multiplies the variance by scale^2."""
        distribution = self._latent_dist(video)
        mean = (self._checked(distribution.mean) - self.shift) * self.scale
        return mean, self._checked(distribution.logvar) + 2 * self.scale.abs().log()

    def _latent_dist(self, video: torch.Tensor):
        if not is_valid_frame_count(self.family, video.shape[1]):
            raise ValueError(f"{video.shape[1]} frames do not suit the {self.family} VAE: use one of "
                             f"{valid_frame_counts(self.family, 50)}")
        x = (video.permute(0, 2, 1, 3, 4) * 2 - 1).to(self.dtype)  # N,C,T,H,W in [-1, 1]
        return self.vae.encode(x).latent_dist

    def _checked(self, latents: torch.Tensor) -> torch.Tensor:
        latents = latents.float().permute(0, 2, 1, 3, 4).contiguous()
        if not torch.isfinite(latents).all():
            raise FloatingPointError(f"the {self.family} reference VAE produced non-finite latents "
                                     "(check its weights and dtype; bf16 overflow shows up here)")
        return latents

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents in the latent space (N,t,C,h,w) -> frames N,T,3,H,W in [0, 1]."""
        raw = latents.float() / self.scale + self.shift
        x = raw.permute(0, 2, 1, 3, 4).to(self.dtype)
        frames = self.vae.decode(x).sample.float()
        return ((frames + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4).contiguous()


def load_reference_vae(family: str, path_or_id: str, device: torch.device, sample_latents: bool = True,
                       tiling: bool = False, dtype: torch.dtype | None = None, latent_space: str = "auto") -> ReferenceVAE:
    """From a local folder (a diffusers pipeline folder with vae/, or a VAE folder itself) or a hub
    id (subfolder vae). bf16 on GPU, fp32 on CPU unless `dtype` says otherwise. Any failure is an
    error that names the path: training never switches to another loss on its own."""
    cls = vae_class(family)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    local = Path(path_or_id)
    try:
        if local.is_dir():
            folder = local / "vae" if (local / "vae" / "config.json").is_file() else local
            vae = cls.from_pretrained(str(folder), torch_dtype=dtype)
        else:
            vae = cls.from_pretrained(path_or_id, subfolder="vae", torch_dtype=dtype)
    except Exception as error:
        raise RuntimeError(f"cannot load the {family} reference VAE from {path_or_id!r}: {error}") from error
    vae.to(device)
    if tiling and hasattr(vae, "enable_tiling"):
        vae.enable_tiling()
    if device.type == "cuda":
        try:
            import xformers  # noqa: F401

            vae.enable_xformers_memory_efficient_attention()
        except Exception:  # optional speed-up only; the plain attention path is correct
            pass
    return ReferenceVAE(vae, family, sample_latents, latent_space)


def tiny_reference_vae_config(family: str) -> dict:
    """A few-hundred-thousand-parameter configuration of the real class, for tests and the CPU."""
    if family == "cogvideox":
        return dict(down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
                    block_out_channels=(8, 8, 16, 16), latent_channels=16, layers_per_block=1, norm_num_groups=4,
                    temporal_compression_ratio=4)
    if family == "hunyuan":
        return dict(down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4,
                    block_out_channels=(8, 8, 16, 16), latent_channels=16, layers_per_block=1, norm_num_groups=4,
                    mid_block_add_attention=False)
    return dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[False, True, True])
