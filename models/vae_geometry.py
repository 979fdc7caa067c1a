"""Any diffusers video autoencoder as a teacher: its geometry measured with the real class, and the
TAEHV student shaped from it (docs/model.md#any-diffusers-video-vae).

`measure_geometry(folder)` builds the class its config.json names with random weights (shapes do
not depend on the weights) and encodes 1..17 frames of 64x64 once each, decoding what each gives:
- latent channels and the spatial factor, from the latents' shape;
- the time factor m, the one for which ceil(frames / m) gives the most measured latent counts;
- the frame map (frames -> latents -> decoded frames), which decides the frame counts a run may use:
  those where the student gives the teacher's latent count and decoded count;
- whether the class encodes only tiled (Allegro), returns frames before channels from decode
  (Allegro), or has no Gaussian to sample (Cosmos: its latent is the distribution's mode);
- the latent spaces its config or buffers define: `scaling_factor` (scaled), `latents_mean` and
  `latents_std` of one value per channel (normalized).
The result is cached in ~/.cache/taehv/vae_geometry.json (models/measure_cache.py) by the config
and this file's code, so a launch measures once per machine. Plain data and the student's shape need no torch; only the
measurement imports it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from models.variants import VARIANTS, TAEHVArgs, public_variant_like, time_flags

MEASURED_FRAMES = tuple(range(1, 18))  # consecutive counts: whole runs of up to 8 frames per latent
SIDE = 64
# config keys that name the files, not the architecture
IGNORED_CONFIG_KEYS = ("_diffusers_version", "_name_or_path", "_commit_hash")


@dataclass(frozen=True)
class VAEGeometry:
    class_name: str
    latent_channels: int
    spatial_factor: int
    time_factor: int
    frame_map: tuple[tuple[int, int, int], ...]  # (frames in, latents, frames decoded; 0 = decode failed)
    latent_spaces: tuple[str, ...]  # raw, and scaled / normalized when the VAE defines them
    needs_tiling: bool = False
    frames_first_decode: bool = False  # decode returns N,T,C,H,W instead of N,C,T,H,W
    deterministic: bool = False  # the encoder's distribution has no mean and log-variance: use its mode

    def to_json_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict) -> "VAEGeometry":
        data = dict(data, frame_map=tuple(tuple(row) for row in data["frame_map"]), latent_spaces=tuple(data["latent_spaces"]))
        return cls(**data)

    @property
    def default_latent_space(self) -> str:
        """What a diffusion pipeline hands its transformer: normalized when the VAE has statistics,
        else scaled when it has a scaling factor, else raw."""
        return next(space for space in ("normalized", "scaled", "raw") if space in self.latent_spaces)

    def summary(self) -> str:
        student, _ = student_for(self)
        frames = valid_frame_counts(self, student, 40)
        example = next(((n, t, d) for n, t, d in self.frame_map if n in frames and t >= 2), None)
        rule = frame_rule_text(self, student) if student else "none"
        return (f"{self.class_name}: {self.latent_channels} latent channels, {self.spatial_factor}x spatial, "
                f"{self.time_factor}x in time, frames {rule}"
                + (f" ({example[0]} frames -> {example[1]} latents -> {example[2]} frames)" if example else "")
                + f", latent spaces {'/'.join(self.latent_spaces)}"
                + (", encodes only tiled" if self.needs_tiling else ""))


# ------------------------------------------------------------------------------------------------
# The student (no torch)
# ------------------------------------------------------------------------------------------------


def student_for(geometry: VAEGeometry) -> tuple[TAEHVArgs | None, str]:
    """(the student's construction arguments, '') or (None, one line saying what was measured and
    why no student fits). A public variant when one has exactly this shape, else one built from
    the same blocks, named taehv_c<channels>_s<spatial>_t<time>."""
    g = geometry
    patch, rest = divmod(g.spatial_factor, 8)
    if rest or patch not in (1, 2, 4):
        return None, (f"{g.class_name} measures {g.spatial_factor}x spatial: the student's encoder is 8x times a "
                      "patch size of 1, 2 or 4 (8x, 16x or 32x)")
    if g.time_factor not in (1, 2, 4, 8):
        example = next(((n, t) for n, t, _ in g.frame_map if t >= 3), g.frame_map[-1][:2])
        return None, (f"{g.class_name} measures {g.time_factor}x in time ({example[0]} frames -> {example[1]} latents): "
                      "the student's time stages each halve time, so it can only take 1x, 2x, 4x or 8x")
    encoder_time, decoder_time = time_flags(g.time_factor)
    candidates = [TAEHVArgs(f"taehv_c{g.latent_channels}_s{g.spatial_factor}_t{g.time_factor}" + ("" if trim else "_notrim"),
                            patch_size=patch, latent_channels=g.latent_channels, encoder_time_downscale=encoder_time,
                            decoder_time_upscale=decoder_time, trim_leading_frames=trim) for trim in (True, False)]
    student = max(candidates, key=lambda args: len(agreeing_counts(g, args)))  # the first (trimming) on a tie
    if not any(student.latent_frame_count(n) >= 2 for n in agreeing_counts(g, student)):
        shown = ", ".join(f"{n}->{t}->{d or 'fails'}" for n, t, d in g.frame_map[:12])
        return None, (f"{g.class_name}: no measured frame count gives 2 or more latents that decode to the frames the "
                      f"student would give (frames -> latents -> decoded: {shown})")
    public = public_variant_like(student)
    return (VARIANTS[public] if public else student), ""


def agreeing_counts(geometry: VAEGeometry, student: TAEHVArgs) -> list[int]:
    """Measured frame counts where the student gives the teacher's latent and decoded counts;
    only those that decode to as many frames as went in, when there are such (5 of 4k+1, not 6)."""
    agreeing = [(n, d) for n, t, d in geometry.frame_map
                if d and student.latent_frame_count(n) == t and student.decoded_frame_count(t) == d]
    round_trips = [n for n, d in agreeing if n == d]
    return round_trips or [n for n, _ in agreeing]


def frame_rule(geometry: VAEGeometry, student: TAEHVArgs) -> tuple[int, int]:
    """(m, r): the counts m*k + r agree (the spacing and offset of the agreeing measured counts)."""
    counts = agreeing_counts(geometry, student)
    modulus = math.gcd(*(b - a for a, b in zip(counts, counts[1:]))) if len(counts) > 1 else student.t_downscale
    return modulus, counts[0] % modulus


def frame_rule_text(geometry: VAEGeometry, student: TAEHVArgs) -> str:
    modulus, remainder = frame_rule(geometry, student)
    return f"{modulus}k+{remainder}" if remainder else f"{modulus}k"


def valid_frame_counts(geometry: VAEGeometry, student: TAEHVArgs | None = None, limit: int = 64) -> list[int]:
    """Counts below `limit` of the rule, from the smallest agreeing count on (beyond the measured
    range the rule is extended: the classes are convolutional in time). `student` defaults to
    student_for(geometry)."""
    student = student or student_for(geometry)[0]
    if student is None:
        return []
    modulus, remainder = frame_rule(geometry, student)
    first = agreeing_counts(geometry, student)[0]
    return [n for n in range(first, limit) if n % modulus == remainder]


# ------------------------------------------------------------------------------------------------
# Reading the folder and measuring (torch only here)
# ------------------------------------------------------------------------------------------------


def vae_config_file(path: str) -> Path | None:
    """config.json of the VAE at a local pipeline folder, its vae/ folder, or a hub id in the cache."""
    local = Path(path)
    for candidate in (local / "vae" / "config.json", local / "config.json"):
        if candidate.is_file():
            return candidate
    if local.exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "vae/config.json")
        return Path(cached) if isinstance(cached, str) else None
    except Exception:  # not a hub id, or no huggingface_hub: nothing readable
        return None


def read_vae_config(path: str) -> dict:
    """The VAE's config.json as a dict; raises ValueError with one line naming the path."""
    file = vae_config_file(path)
    if file is None:
        raise ValueError(f"ref_vae_path={path!r} holds no vae/config.json or config.json (nor is it a hub id in the "
                         "Hugging Face cache): point it at a diffusers pipeline folder or its vae/ subfolder")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{file} is not readable JSON ({error}): re-download the VAE's config.json") from None
    if not isinstance(config, dict) or not isinstance(config.get("_class_name"), str):
        raise ValueError(f"{file} names no diffusers class (_class_name): point ref_vae_path at a diffusers VAE")
    return config


def identify(family: str, path: str) -> tuple[str, VAEGeometry | None]:
    """ref_vae_family (a family, or auto) and ref_vae_path -> (the family, None), or for a class no
    family names (its class name, its measured geometry). ValueError: one line naming the path."""
    from models.reference_families import CLASS_FAMILIES

    if family != "auto":
        return family, None
    name = read_vae_config(path)["_class_name"]
    if name in CLASS_FAMILIES:
        return CLASS_FAMILIES[name], None
    return name, geometry_of(path)


def geometry_key(config: dict) -> str:
    from importlib.metadata import version  # not `import diffusers` (4 s): a cache hit needs only its version

    architecture = {k: v for k, v in sorted(config.items()) if k not in IGNORED_CONFIG_KEYS}
    code = Path(__file__).read_bytes()
    text = json.dumps([architecture, version("diffusers")], sort_keys=True).encode()
    return hashlib.sha1(text + code).hexdigest()


def geometry_of(path: str) -> VAEGeometry:
    """The measured geometry of the VAE at `path`, from the cache when measured before."""
    from models.measure_cache import cached

    config = read_vae_config(path)
    return VAEGeometry.from_json_dict(cached("vae_geometry", geometry_key(config),
                                             lambda: measure_geometry(config).to_json_dict()))


def build_vae(config: dict):
    """The class config.json names, with random weights, on the CPU in fp32."""
    import diffusers

    name = config["_class_name"]
    cls = getattr(diffusers, name, None)
    if cls is None or not hasattr(cls, "encode") or not hasattr(cls, "decode"):
        raise ValueError(f"_class_name {name!r} is no diffusers autoencoder of diffusers {diffusers.__version__}: "
                         "upgrade diffusers or point ref_vae_path at another VAE")
    return cls.from_config({k: v for k, v in config.items() if not k.startswith("_")}).eval()


def latent_of(distribution):
    """The latent a distribution stands for: its mean, or its mode when it has no mean (Cosmos)."""
    return distribution.mean if hasattr(distribution, "mean") else distribution.mode()


def decoded_frames(output, frames_first: bool):
    """N,C,T,H,W frames from a decode's output (a tensor or an object with .sample)."""
    frames = getattr(output, "sample", output)
    return frames.transpose(1, 2) if frames_first else frames


def measured_time_factor(rows: list[tuple[int, int, int]]) -> int:
    """Frames per latent: the most common length of the runs of consecutive counts that give the
    same latent count (only runs with measured counts on both sides), else the overall slope."""
    latents = {n: t for n, t, _ in rows}
    lengths, start = [], None
    for n in sorted(latents):
        if n - 1 not in latents:
            start = None  # a gap: the run before it is not whole
        elif latents[n] != latents[n - 1]:
            if start is not None:
                lengths.append(n - start)
            start = n
    if lengths:
        return max(set(lengths), key=lambda length: (lengths.count(length), -length))
    (n0, t0, _), (n1, t1, _) = rows[0], rows[-1]
    return max(1, round((n1 - n0) / (t1 - t0))) if t1 != t0 else 1


def measure_geometry(config: dict) -> VAEGeometry:
    import torch

    vae = build_vae(config)
    name = config["_class_name"]
    generator = torch.Generator().manual_seed(0)

    def encode(frames: int):
        pixels = torch.rand(1, 3, frames, SIDE, SIDE, generator=generator) * 2 - 1
        return vae.encode(pixels).latent_dist

    needs_tiling, rows, shape, frames_first, deterministic = False, [], (), False, False
    with torch.no_grad():
        for attempt in ("plain", "tiled"):
            if attempt == "tiled":
                if not hasattr(vae, "enable_tiling"):
                    break
                vae.enable_tiling()
                needs_tiling = True
            for frames in MEASURED_FRAMES:
                try:
                    distribution = encode(frames)
                    latents = latent_of(distribution)
                except Exception:  # a count the class does not take; a failed call may leave caches behind
                    vae = build_vae(config)
                    if needs_tiling:
                        vae.enable_tiling()
                    continue
                shape, deterministic = tuple(latents.shape), not hasattr(distribution, "logvar")
                try:
                    output = vae.decode(latents)
                    sample = getattr(output, "sample", output)
                    # channels are 3 and time is not (or both are 3: decided by another count)
                    if sample.shape[2] == 3 and sample.shape[1] != 3:
                        frames_first = True
                    decoded = sample.shape[1] if frames_first else sample.shape[2]
                except Exception:
                    decoded = 0
                    vae = build_vae(config)
                    if needs_tiling:
                        vae.enable_tiling()
                rows.append((frames, int(latents.shape[2]), int(decoded)))
            if rows:
                break
    if not rows:
        raise ValueError(f"{name} encodes none of 1..{MEASURED_FRAMES[-1]} frames at {SIDE}x{SIDE}, tiled or not: "
                         "it cannot be measured; name its family with ref_vae_family if it is one of ours")
    time_factor = measured_time_factor(rows)
    buffers = dict(vae.named_buffers())
    spaces = ["raw"]
    if config.get("scaling_factor") is not None:
        spaces.append("scaled")
    mean = buffers["latents_mean"].flatten().tolist() if "latents_mean" in buffers else config.get("latents_mean")
    if mean is not None and len(mean) == shape[1]:  # per channel (Cosmos keeps per channel and frame: not used)
        spaces.append("normalized")
    return VAEGeometry(name, int(shape[1]), SIDE // int(shape[-1]), time_factor, tuple(rows), tuple(spaces), needs_tiling,
                       frames_first, deterministic)


def resolve_latent_space(geometry: VAEGeometry, choice: str = "auto") -> str:
    """`auto` -> what its pipeline would use (see `default_latent_space`); an explicit space is
    checked against what the VAE defines."""
    space = geometry.default_latent_space if choice == "auto" else choice
    if space not in geometry.latent_spaces:
        raise ValueError(f"ref_vae_latent_space={choice!r} is not available for {geometry.class_name}: it defines "
                         f"{', '.join(geometry.latent_spaces)} (scaled needs scaling_factor, normalized latents_mean/std)")
    return space
