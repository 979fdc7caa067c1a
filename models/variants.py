"""TAEHV variants as plain data (no torch import): the launcher's config check reads them in a
process that never builds a model, and models/taehv/ builds modules from them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Chunking:
    """Time handled in the fixed chunks of a reference VAE (MiniMax H3): every chunk of `frames` input
    frames gets zero frames in front up to a multiple of t_downscale and is encoded with empty
    memory; the clip's last `dropped_latents` latents are dropped, as that VAE does."""

    frames: int
    dropped_latents: int


CHUNKINGS: dict[str, Chunking | None] = {
    "none": None,
    "minimax_h3": Chunking(frames=17, dropped_latents=3),
}

# Channels of the three stages of the base-layout decoder (MemBlock stages with nearest upsampling),
# per decoder kind; the last stage always narrows to 64 before the output conv.
BASE_LAYOUT_WIDTHS: dict[str, tuple[int, int, int]] = {"base": (256, 128, 64), "wide": (1024, 512, 256)}
DECODER_KINDS = ("base", "super", "wide")


@dataclass(frozen=True)
class TAEHVArgs:
    """Everything needed to rebuild a TAEHV model; stored in checkpoints and model_info.json.
    Also answers the frame arithmetic questions (see the module docstring) without a model."""

    variant: str = "taehv"
    patch_size: int = 1
    latent_channels: int = 16
    decoder_kind: str = "base"  # "base" (MemBlocks), "super" (depthwise blocks) or "wide" (WideMemBlocks)
    encoder_time_downscale: tuple[bool, bool, bool] = (True, True, False)
    decoder_time_upscale: tuple[bool, bool, bool] = (False, True, True)
    decoder_space_upscale: tuple[bool, bool, bool] = (True, True, True)
    # CogVideoX keeps the first decoded frames when the latent count is even.
    cogvideox_trim_rule: bool = False
    # True: the teacher encodes the first frame alone (m*k + 1 frames -> k + 1 latents), so the decoder
    # drops its first frames_to_trim outputs. False: m*k frames -> k latents -> m*k frames (Allegro).
    trim_leading_frames: bool = True
    chunking: str = "none"  # a key of CHUNKINGS: "none" or "minimax_h3"

    def to_json_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json_dict(cls, data: dict) -> "TAEHVArgs":
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TAEHV construction argument(s) {unknown}; known: {sorted(known)}")
        return cls(**{k: tuple(bool(x) for x in v) if isinstance(v, list) else v for k, v in data.items()})

    # frame arithmetic -------------------------------------------------------------------------
    @property
    def t_downscale(self) -> int:
        return 2 ** sum(self.encoder_time_downscale)

    @property
    def t_upscale(self) -> int:
        return 2 ** sum(self.decoder_time_upscale)

    @property
    def frames_to_trim(self) -> int:
        return self.t_upscale - 1

    @property
    def spatial_downscale(self) -> int:
        return 8 * self.patch_size

    @property
    def chunk(self) -> Chunking | None:
        return CHUNKINGS[self.chunking]

    @property
    def chunk_lead_frames(self) -> int:
        """Zero frames put in front of each chunk so that it fills whole latents (H3: 3)."""
        return -self.chunk.frames % self.t_downscale

    @property
    def chunk_latents(self) -> int:
        """Latents per encoded chunk (H3: 5)."""
        return (self.chunk.frames + self.chunk_lead_frames) // self.t_downscale

    @property
    def chunk_decoded_frames(self) -> int:
        """Decoder outputs per chunk, before its trim (H3: 20)."""
        return self.chunk_latents * self.t_upscale

    def trims_leading_frames(self, n_latent_frames: int) -> bool:
        return self.trim_leading_frames and not (self.cogvideox_trim_rule and n_latent_frames % 2 == 0)

    def latent_frame_count(self, n_frames: int) -> int:
        """Latent frames that `encode_video` returns for n_frames input frames."""
        if n_frames < 1:
            raise ValueError(f"a clip needs at least 1 frame, got {n_frames}")
        if self.chunk is None:
            return -(-n_frames // self.t_downscale)
        return self.chunk_latents * -(-n_frames // self.chunk.frames) - self.chunk.dropped_latents

    def decoded_frame_count(self, n_latent_frames: int) -> int:
        """Frames that `decode_video` returns for n_latent_frames latents."""
        if n_latent_frames < 1:
            raise ValueError(f"decoding needs at least 1 latent frame, got {n_latent_frames}")
        if self.chunk is None:
            frames = n_latent_frames * self.t_upscale
            return frames - self.frames_to_trim if self.trims_leading_frames(n_latent_frames) else frames
        chunks = -(-n_latent_frames // self.chunk_latents)
        kept_per_chunk = self.chunk_decoded_frames - self.frames_to_trim
        return kept_per_chunk * chunks - self.chunk.dropped_latents * self.t_upscale

    def frame_rule(self) -> tuple[int, int]:
        """(m, r): clips of m*k + r frames (k >= 0) decode back to as many frames, when
        t_upscale == t_downscale. 4k+1 for most variants, 8k+1 for taecvx and taeltx*, 17k+5 for taeh3."""
        if self.chunk is not None:
            return self.chunk.frames, self.chunk.frames - self.chunk.dropped_latents * self.t_upscale
        if not self.trim_leading_frames:
            return self.t_downscale, 0
        # CogVideoX trims only for odd latent counts: only every other latent count round-trips
        return self.t_downscale * (2 if self.cogvideox_trim_rule else 1), 1

    def is_valid_frame_count(self, n_frames: int) -> bool:
        modulus, remainder = self.frame_rule()
        return (
            n_frames >= 1
            and n_frames % modulus == remainder % modulus
            and self.decoded_frame_count(self.latent_frame_count(n_frames)) == n_frames
        )

    def valid_frame_counts(self, limit: int) -> list[int]:
        """Valid clip lengths up to `limit` frames, for messages like "use 9 or 17"."""
        return [n for n in range(1, limit + 1) if self.is_valid_frame_count(n)]


_LTX = dict(patch_size=4, latent_channels=128, encoder_time_downscale=(True, True, True),
            decoder_time_upscale=(True, True, True))
VARIANTS: dict[str, TAEHVArgs] = {
    "taehv": TAEHVArgs("taehv"),
    "taecvx": TAEHVArgs("taecvx", cogvideox_trim_rule=True),
    "taew2_1": TAEHVArgs("taew2_1"),
    "taeos1_3": TAEHVArgs("taeos1_3"),
    "taehv1_5": TAEHVArgs("taehv1_5", patch_size=2, latent_channels=32),
    "taew2_2": TAEHVArgs("taew2_2", patch_size=2, latent_channels=48),
    "taehv1_5_super": TAEHVArgs("taehv1_5_super", patch_size=2, latent_channels=32, decoder_kind="super"),
    "taew2_2_super": TAEHVArgs("taew2_2_super", patch_size=2, latent_channels=48, decoder_kind="super"),
    # LTX-2 and LTX-2.3 share one architecture (different weights); shape inference names taeltx_2.
    "taeltx_2": TAEHVArgs("taeltx_2", **_LTX),
    "taeltx2_3": TAEHVArgs("taeltx2_3", **_LTX),
    "taeltx2_3_wide": TAEHVArgs("taeltx2_3_wide", decoder_kind="wide", **_LTX),
    "taeh3": TAEHVArgs("taeh3", patch_size=2, latent_channels=24, chunking="minimax_h3"),
}


def time_flags(factor: int) -> tuple[tuple[bool, bool, bool], tuple[bool, bool, bool]]:
    """(encoder_time_downscale, decoder_time_upscale) for a time factor of 1, 2, 4 or 8: the encoder
    halves time in its first stages, the decoder doubles it in its last (4: the public layout)."""
    stages = {1: 0, 2: 1, 4: 2, 8: 3}[factor]
    return tuple(i < stages for i in range(3)), tuple(i >= 3 - stages for i in range(3))


def check_args(args: TAEHVArgs) -> TAEHVArgs:
    if args.decoder_kind not in DECODER_KINDS:
        raise ValueError(f"decoder_kind must be one of {DECODER_KINDS}, got {args.decoder_kind!r}")
    if args.chunking not in CHUNKINGS:
        raise ValueError(f"chunking must be one of {sorted(CHUNKINGS)}, got {args.chunking!r}")
    if args.chunk is not None and (args.cogvideox_trim_rule or not args.trim_leading_frames):
        raise ValueError("chunking cannot be combined with cogvideox_trim_rule or trim_leading_frames=false "
                         "(each decides the decoded frames)")
    for key in ("encoder_time_downscale", "decoder_time_upscale", "decoder_space_upscale"):
        if len(getattr(args, key)) != 3:
            raise ValueError(f"{key} needs 3 flags, got {getattr(args, key)}")
    return args


def public_variant_like(args: TAEHVArgs) -> str | None:
    """The public variant with exactly these construction arguments (its name aside), if any."""
    return next((name for name, public in VARIANTS.items() if replace(public, variant=args.variant) == args), None)


def resolve_args(variant: str = "taehv", **overrides) -> TAEHVArgs:
    """Variant defaults with explicit overrides applied (unknown names are errors)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown TAEHV variant {variant!r}; choose one of {sorted(VARIANTS)}")
    known = set(TAEHVArgs.__dataclass_fields__) - {"variant"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown TAEHV argument(s) {unknown}; known: {sorted(known)}")
    for key in ("encoder_time_downscale", "decoder_time_upscale", "decoder_space_upscale"):
        if key in overrides:
            overrides[key] = tuple(bool(x) for x in overrides[key])
            if len(overrides[key]) != 3:
                raise ValueError(f"{key} needs 3 flags, got {overrides[key]}")
    return check_args(replace(VARIANTS[variant], **overrides))


# Exports are named as the public files are: upstream's taehv.py (madebyollin/taehv) builds its
# architecture from the weight file's path alone ("taecvx" in it switches on the CogVideoX frame rule,
# "taew2_2" patch 2 and 48 channels, "_super" the super decoder...), and so do the tools built on it.
# Exports written before 2026-11-28 were taehv.pth / taehv.safetensors whatever their variant.
LEGACY_EXPORT_STEM = "taehv"
WEIGHT_SUFFIXES = (".safetensors", ".pth")


def export_file_names(variant: str) -> tuple[str, str]:
    """(`<variant>.pth`, `<variant>.safetensors`): the names an export of that variant is written under."""
    return f"{variant}.pth", f"{variant}.safetensors"


def file_names_variant(path: Path | str, variant: str) -> bool:
    """Whether a weight file's name names `variant` as the public files do: the stem is the variant,
    alone or followed by `_` or `-` (`taecvx.pth`, `taecvx_ema.safetensors`), and no longer variant
    name fits it (`taehv1_5_x.pth` names taehv1_5, not taehv)."""
    stem = Path(str(path)).name.split(".")[0].lower()
    named = [v for v in {*VARIANTS, variant} if stem == v or (stem.startswith(v) and stem[len(v)] in "_-")]
    return bool(named) and max(named, key=len) == variant


def export_in(folder: Path | str) -> Path | None:
    """The weight file of an export folder (final/, best_model/, a converted checkpoint): the one its
    model_info.json names by variant, else an older export's taehv.safetensors / taehv.pth, else the
    folder's only weight file; .safetensors before .pth. None when the folder holds none."""
    folder = Path(folder)
    stems = []
    try:
        stems.append(json.loads((folder / "model_info.json").read_text())["model_args"]["variant"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    stems.append(LEGACY_EXPORT_STEM)
    for stem in stems:
        for suffix in WEIGHT_SUFFIXES:
            if (folder / f"{stem}{suffix}").is_file():
                return folder / f"{stem}{suffix}"
    for suffix in WEIGHT_SUFFIXES:
        found = sorted(folder.glob(f"*{suffix}")) if folder.is_dir() else []
        if len(found) == 1:
            return found[0]
    return None


def block_average_start_problem(args) -> str:
    """'' when models/taehv/block_average_start.py fits the variant's construction arguments, else why not (one line)."""
    frames = args.t_downscale
    if args.decoder_kind != "base":
        return f"the block-average start needs the base decoder (MemBlocks), not {args.decoder_kind!r}"
    if args.chunking != "none" or args.cogvideox_trim_rule or not args.trim_leading_frames:
        return "the block-average start needs the plain leading-frame trim (no chunking, no CogVideoX rule)"
    if args.t_upscale != frames:
        return f"the block-average start needs equal time factors, got {frames} down and {args.t_upscale} up"
    if 3 * frames > args.latent_channels:
        return f"the block-average start needs {3 * frames} latent channels (3 per frame of a latent), got {args.latent_channels}"
    return ""
