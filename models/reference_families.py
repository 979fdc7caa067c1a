"""The reference VAE families as plain data (no torch import), one Family record each: class,
frame rule, latent spaces, public variant, parameter count, pixel normalisation. The launcher's
config check reads them; models/reference_vae.py loads the VAEs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One reference VAE family: everything the launcher, the config check, the loader and the
    memory estimate know of it. A new family is one record in FAMILY_RECORDS (plus, for the tests
    and the CPU, a tiny config in models/reference_vae.py tiny_reference_vae_config)."""

    name: str
    vae_class: str  # the diffusers class; ref_vae_family=auto reads the class from the VAE's config.json
    # valid frame counts: n % modulus == remainder (and n > modulus, for at least two latents), measured on the class
    frame_rule: tuple[int, int]
    latent_space: str  # ref_vae_latent_space=auto: the space the family's public TAEHV weights work in (reference_vae.py)
    latent_spaces: tuple[str, ...]  # the spaces its VAE can express (no latents_mean/std, or no scaling_factor)
    public_variant: str  # the public TAEHV variant (model_variant=auto)
    parameter_count: float  # of its published architecture: its bf16 weights in the memory estimate
    public_pipeline: str = ""  # a public diffusers pipeline with a well-known hub id, named in hints ("": none named)
    layouts: tuple[tuple[str, object, str], ...] = ()  # (VAE config key, value, public variant) of other layouts
    imagenet_pixels: bool = False  # its VAE takes and returns ImageNet-normalised pixels, not [-1, 1]
    help: str = ""  # said after its name in ref_vae_family's help


# frame rules measured on each class: Hunyuan 1.5 and Wan (2.1, 2.2) 4k+1, LTX and LTX-2 8k+1, MiniMax H3 17n+5 -> 5n+2;
# default latent spaces: evidence for cogvideox and wan, the others the space their diffusion pipeline works in
FAMILY_RECORDS = (
    Family("cogvideox", "AutoencoderKLCogVideoX", (8, 1), "raw", ("raw", "scaled"), "taecvx", 215.6e6,
           public_pipeline="THUDM/CogVideoX-2b"),
    Family("hunyuan", "AutoencoderKLHunyuanVideo", (4, 1), "scaled", ("raw", "scaled"), "taehv", 246.5e6,
           public_pipeline="hunyuanvideo-community/HunyuanVideo"),
    Family("hunyuan1_5", "AutoencoderKLHunyuanVideo15", (4, 1), "scaled", ("raw", "scaled"), "taehv1_5", 1260.6e6),
    # Wan 2.2's 48-channel layout (z_dim 48) has 704.7e6 parameters; the estimate counts 2.1's
    Family("wan", "AutoencoderKLWan", (4, 1), "normalized", ("raw", "normalized"), "taew2_1", 126.9e6,
           public_pipeline="Wan-AI/Wan2.1-T2V-1.3B-Diffusers", layouts=(("z_dim", 48, "taew2_2"),),
           help="2.1 or 2.2, from its config"),
    Family("ltx", "AutoencoderKLLTXVideo", (8, 1), "normalized", ("raw", "normalized"), "taeltx_2", 419.2e6,
           public_pipeline="Lightricks/LTX-Video"),
    Family("ltx2", "AutoencoderKLLTX2Video", (8, 1), "normalized", ("raw", "normalized"), "taeltx_2", 1222.5e6),
    Family("minimax_h3", "AutoencoderKLMiniMaxH3", (17, 5), "normalized", ("raw", "normalized"), "taeh3", 2603.9e6,
           imagenet_pixels=True),
)
FAMILY = {f.name: f for f in FAMILY_RECORDS}

# the tables other code reads, derived from the records
FAMILIES = tuple(FAMILY)
FAMILY_CLASSES = {f.name: f.vae_class for f in FAMILY_RECORDS}
CLASS_FAMILIES = {f.vae_class: f.name for f in FAMILY_RECORDS}
FRAME_RULES = {f.name: f.frame_rule for f in FAMILY_RECORDS}
PUBLIC_PIPELINES = {f.name: f.public_pipeline for f in FAMILY_RECORDS if f.public_pipeline}
DEFAULT_LATENT_SPACE = {f.name: f.latent_space for f in FAMILY_RECORDS}
SUPPORTED_LATENT_SPACES = {f.name: f.latent_spaces for f in FAMILY_RECORDS}


def families_help() -> str:
    """The families as ref_vae_family's help lists them."""
    return ", ".join(f"{f.name} ({f.help})" if f.help else f.name for f in FAMILY_RECORDS)


def public_variant(family: str, vae_config: dict | None = None) -> str:
    """The public TAEHV variant of a family (model_variant=auto), by its layout where it has several (Wan 2.2: 48 channels)."""
    record = FAMILY[family]
    return next((variant for key, value, variant in record.layouts if (vae_config or {}).get(key) == value),
                record.public_variant)


# the pixels of a family with imagenet_pixels (MiniMax H3); the others take [-1, 1]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def is_valid_frame_count(family: str, n_frames: int) -> bool:
    modulus, remainder = FRAME_RULES[family]
    return n_frames > modulus and n_frames % modulus == remainder


def valid_frame_counts(family: str, limit: int = 64) -> list[int]:
    return [n for n in range(1, limit) if is_valid_frame_count(family, n)]


LATENT_SPACES = ("raw", "scaled", "normalized")


def resolve_latent_space(family: str, choice: str = "auto") -> str:
    """`auto` -> the family's default; an explicit space is checked against what the family supports."""
    space = DEFAULT_LATENT_SPACE[family] if choice == "auto" else choice
    if space not in SUPPORTED_LATENT_SPACES[family]:
        raise ValueError(f"ref_vae_latent_space={choice!r} is not available for the {family} VAE: choose auto or one of "
                         f"{', '.join(SUPPORTED_LATENT_SPACES[family])}")
    return space
