"""The reference VAE families as plain data (no torch import): frame rules, latent spaces, pixel
normalisation. The launcher's config check reads them; models/reference_vae.py loads the VAEs."""

from __future__ import annotations

FAMILIES = ("cogvideox", "hunyuan", "hunyuan1_5", "wan", "ltx", "ltx2", "minimax_h3")
# the diffusers class of each family; ref_vae_family=auto reads the class from the VAE's config.json
FAMILY_CLASSES = {"cogvideox": "AutoencoderKLCogVideoX", "hunyuan": "AutoencoderKLHunyuanVideo",
                  "hunyuan1_5": "AutoencoderKLHunyuanVideo15", "wan": "AutoencoderKLWan", "ltx": "AutoencoderKLLTXVideo",
                  "ltx2": "AutoencoderKLLTX2Video", "minimax_h3": "AutoencoderKLMiniMaxH3"}
CLASS_FAMILIES = {name: family for family, name in FAMILY_CLASSES.items()}


def public_variant(family: str, vae_config: dict | None = None) -> str:
    """The public TAEHV variant of a family (model_variant=auto); Wan by its layout (2.2: 48 channels)."""
    if family == "wan":
        return "taew2_2" if (vae_config or {}).get("z_dim") == 48 else "taew2_1"
    return {"cogvideox": "taecvx", "hunyuan": "taehv", "hunyuan1_5": "taehv1_5", "ltx": "taeltx_2", "ltx2": "taeltx_2",
            "minimax_h3": "taeh3"}[family]
# valid frame counts: n % modulus == remainder (and n >= remainder + modulus for at least two latents),
# measured on each class: Hunyuan 1.5 and Wan (2.1, 2.2) 4k+1, LTX and LTX-2 8k+1, MiniMax H3 17n+5 -> 5n+2
FRAME_RULES = {"cogvideox": (8, 1), "hunyuan": (4, 1), "hunyuan1_5": (4, 1), "wan": (4, 1), "ltx": (8, 1), "ltx2": (8, 1),
               "minimax_h3": (17, 5)}
# a public diffusers pipeline of each family with a well-known hub id, named in hints (others: none named)
PUBLIC_PIPELINES = {"cogvideox": "THUDM/CogVideoX-2b", "hunyuan": "hunyuanvideo-community/HunyuanVideo",
                    "wan": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "ltx": "Lightricks/LTX-Video"}
# MiniMax H3's VAE takes and returns ImageNet-normalised pixels; the others [-1, 1]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def is_valid_frame_count(family: str, n_frames: int) -> bool:
    modulus, remainder = FRAME_RULES[family]
    return n_frames > modulus and n_frames % modulus == remainder


def valid_frame_counts(family: str, limit: int = 64) -> list[int]:
    return [n for n in range(1, limit) if is_valid_frame_count(family, n)]


LATENT_SPACES = ("raw", "scaled", "normalized")
# evidence for cogvideox and wan; the others: the space their diffusion pipeline works in (module docstring)
DEFAULT_LATENT_SPACE = {"cogvideox": "raw", "hunyuan": "scaled", "hunyuan1_5": "scaled", "wan": "normalized",
                        "ltx": "normalized", "ltx2": "normalized", "minimax_h3": "normalized"}
# the spaces a family's VAE can express (CogVideoX and Hunyuan have no latents_mean/std, Wan and MiniMax H3 no scaling_factor)
SUPPORTED_LATENT_SPACES = {"cogvideox": ("raw", "scaled"), "hunyuan": ("raw", "scaled"), "hunyuan1_5": ("raw", "scaled"),
                           "wan": ("raw", "normalized"), "ltx": ("raw", "normalized"), "ltx2": ("raw", "normalized"),
                           "minimax_h3": ("raw", "normalized")}


def resolve_latent_space(family: str, choice: str = "auto") -> str:
    """`auto` -> the family's default; an explicit space is checked against what the family supports."""
    space = DEFAULT_LATENT_SPACE[family] if choice == "auto" else choice
    if space not in SUPPORTED_LATENT_SPACES[family]:
        raise ValueError(f"ref_vae_latent_space={choice!r} is not available for the {family} VAE: choose auto or one of "
                         f"{', '.join(SUPPORTED_LATENT_SPACES[family])}")
    return space
