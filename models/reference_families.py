"""The reference VAE families as plain data (no torch import), one Family record each: class,
frame rule, latent spaces, public variant, parameter count, pixel normalisation. The launcher's
config check reads them; models/reference_vae.py loads the VAEs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath


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
    # public diffusers pipelines on the Hugging Face hub (their vae/ is the reference), the family's default first;
    # a download hint names the one whose name the folder's name matches (hub_repo_for)
    hub_repos: tuple[str, ...] = ()
    layouts: tuple[tuple[str, object, str], ...] = ()  # (VAE config key, value, public variant) of other layouts
    imagenet_pixels: bool = False  # its VAE takes and returns ImageNet-normalised pixels, not [-1, 1]
    help: str = ""  # said after its name in ref_vae_family's help


# frame rules measured on each class: Hunyuan 1.5 and Wan (2.1, 2.2) 4k+1, LTX and LTX-2 8k+1, MiniMax H3 17n+5 -> 5n+2;
# default latent spaces: evidence for cogvideox and wan, the others the space their diffusion pipeline works in
FAMILY_RECORDS = (
    Family("cogvideox", "AutoencoderKLCogVideoX", (8, 1), "raw", ("raw", "scaled"), "taecvx", 215.6e6,
           hub_repos=("THUDM/CogVideoX-2b", "THUDM/CogVideoX-5b", "THUDM/CogVideoX-5b-I2V", "THUDM/CogVideoX1.5-5B")),
    Family("hunyuan", "AutoencoderKLHunyuanVideo", (4, 1), "scaled", ("raw", "scaled"), "taehv", 246.5e6,
           hub_repos=("hunyuanvideo-community/HunyuanVideo", "hunyuanvideo-community/HunyuanVideo-I2V")),
    Family("hunyuan1_5", "AutoencoderKLHunyuanVideo15", (4, 1), "scaled", ("raw", "scaled"), "taehv1_5", 1260.6e6,
           hub_repos=("hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v", "hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v")),
    # Wan 2.2's 48-channel layout (z_dim 48) has 704.7e6 parameters; the estimate counts 2.1's. Wan 2.2's 5B
    # pipeline (TI2V) has the 48-channel VAE, its A14B ones 2.1's
    Family("wan", "AutoencoderKLWan", (4, 1), "normalized", ("raw", "normalized"), "taew2_1", 126.9e6,
           hub_repos=("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "Wan-AI/Wan2.1-T2V-14B-Diffusers", "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
                      "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "Wan-AI/Wan2.2-I2V-A14B-Diffusers"),
           layouts=(("z_dim", 48, "taew2_2"),), help="2.1 or 2.2, from its config"),
    Family("ltx", "AutoencoderKLLTXVideo", (8, 1), "normalized", ("raw", "normalized"), "taeltx_2", 419.2e6,
           hub_repos=("Lightricks/LTX-Video", "Lightricks/LTX-Video-0.9.5")),
    Family("ltx2", "AutoencoderKLLTX2Video", (8, 1), "normalized", ("raw", "normalized"), "taeltx_2", 1222.5e6,
           hub_repos=("Lightricks/LTX-2", "diffusers/LTX-2.3-Diffusers")),
    Family("minimax_h3", "AutoencoderKLMiniMaxH3", (17, 5), "normalized", ("raw", "normalized"), "taeh3", 2603.9e6,
           imagenet_pixels=True),
)
FAMILY = {f.name: f for f in FAMILY_RECORDS}

# the tables other code reads, derived from the records
FAMILIES = tuple(FAMILY)
FAMILY_CLASSES = {f.name: f.vae_class for f in FAMILY_RECORDS}
CLASS_FAMILIES = {f.vae_class: f.name for f in FAMILY_RECORDS}
FRAME_RULES = {f.name: f.frame_rule for f in FAMILY_RECORDS}
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


def folder_name(folder: str) -> str:
    """The name that says which model a folder holds: its last part, or the one above a `vae` subfolder."""
    parts = [part for part in PurePath(folder).parts if part not in ("/", ".", "..")]
    if len(parts) > 1 and parts[-1].lower() == "vae":
        parts.pop()
    return parts[-1] if parts else ""


def name_match(folder: str, repo: str) -> int:
    """How much of a folder's name a hub repository's name holds: the characters of the name's words
    (split at -, _, spaces; other punctuation dropped: Wan2.2 and wan22 are one word) found in the
    repository's name, punctuation dropped."""
    words = [re.sub(r"[^a-z0-9]", "", word) for word in re.split(r"[-_\s]+", folder_name(folder).lower())]
    name = re.sub(r"[^a-z0-9]", "", repo.rpartition("/")[2].lower())
    return sum(len(word) for word in words if word and word in name)


def hub_repo_for(family: str, folder: str) -> str:
    """The family's public pipeline whose name best matches the folder's (CogVideoX-5b ->
    THUDM/CogVideoX-5b, Wan2.2 -> Wan-AI/Wan2.2-TI2V-5B-Diffusers), else its default; '' for a family
    without one."""
    repos = FAMILY[family].hub_repos if family in FAMILY else ()
    if not repos:
        return ""
    return max(repos, key=lambda repo: name_match(folder, repo))  # the first of the best: the default on a tie


def family_named_by(folder: str) -> str:
    """The family whose pipelines' names match the folder's name strictly best ('' when none, a tie, or
    a match of under 3 characters: `x` is in CogVideoX and in LTX)."""
    scores = sorted(((max((name_match(folder, repo) for repo in f.hub_repos), default=0), f.name) for f in FAMILY_RECORDS),
                    reverse=True)
    (best, family), (second, _) = scores[0], scores[1]
    return family if best > second and best >= 3 else ""


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
