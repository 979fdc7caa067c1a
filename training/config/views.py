"""Views of a resolved config that other layers read: the student's arguments, the reference's
geometry, frame rules, the latent space, the summary lines."""

from __future__ import annotations

import dataclasses
import json

from models.reference_families import FAMILY, FRAME_RULES, public_variant, resolve_latent_space
from models.reference_families import valid_frame_counts as reference_frame_counts
from models.variants import VARIANTS, TAEHVArgs
from training.config.schema import ConfigError, TrainConfig


def student_of(config: TrainConfig) -> TAEHVArgs:
    """The student's construction arguments (resolved from model_variant by validate; before
    that, a named variant's own)."""
    return TAEHVArgs.from_json_dict(config.student_args) if config.student_args else VARIANTS[config.model_variant]


def measured_geometry(config: TrainConfig):
    """The VAEGeometry of a reference VAE no family names, else None."""
    if not config.reference_geometry:
        return None
    from models.vae_geometry import VAEGeometry

    return VAEGeometry.from_json_dict(config.reference_geometry)


def measured_values(config: TrainConfig, keys: tuple[str, ...]) -> list:
    """What a cached measurement (models/measure_cache.py) depends on of these keys: whether a latent
    cache is used, not where; the reference VAE's architecture, not the folder it lies in (a named
    family is measured in its published architecture, a VAE no family names in its config.json's)."""
    def value(key: str):
        if key == "latent_cache":
            return bool(config.latent_cache)
        if key == "ref_vae_path":
            from models.vae_geometry import geometry_key, read_vae_config

            return geometry_key(read_vae_config(config.ref_vae_path)) if config.reference_geometry else ""
        return getattr(config, key)

    return [value(key) for key in keys]


def resolve_reference(c: TrainConfig) -> None:
    """ref_vae_family=auto -> the family of the class ref_vae_path's config.json names, or that
    class measured (models/vae_geometry.py: torch is imported only then); model_variant=auto ->
    the student that fits. Sets the derived reference_family, reference_geometry, student_args."""
    from models import vae_geometry

    c.reference_family, c.reference_geometry = "", {}
    if c.use_ref_vae:
        try:
            c.reference_family, geometry = vae_geometry.identify(c.ref_vae_family, c.ref_vae_path)
        except ValueError as error:
            raise ConfigError(f"ref_vae_family=auto: {error}, or name the family (ref_vae_family=...)") from None
        c.reference_geometry = geometry.to_json_dict() if geometry else {}
    geometry = measured_geometry(c)
    if c.model_variant != "auto":
        args = VARIANTS[c.model_variant]
        c.student_args = args.to_json_dict()
        if geometry is not None and ((args.latent_channels, args.spatial_downscale) != (geometry.latent_channels, geometry.spatial_factor)
                                     or not any(args.latent_frame_count(n) >= 2 for n in vae_geometry.agreeing_counts(geometry, args))):
            raise ConfigError(f"model_variant={c.model_variant} ({args.latent_channels} latent channels, {args.spatial_downscale}x "
                              f"spatial, {args.t_downscale}x in time) does not fit the measured {geometry.summary()}: "
                              "use model_variant=auto")
        return
    if geometry is not None:
        args, problem = vae_geometry.student_for(geometry)
        if problem:
            raise ConfigError(f"model_variant=auto: {problem}")
        c.student_args = args.to_json_dict()
    elif c.use_ref_vae:
        vae_config = None
        if FAMILY[c.reference_family].layouts:  # the layout decides (Wan 2.2): read it when the folder has it
            try:
                vae_config = vae_geometry.read_vae_config(c.ref_vae_path)
            except ValueError:
                pass
        c.student_args = VARIANTS[public_variant(c.reference_family, vae_config)].to_json_dict()
    else:
        raise ConfigError("model_variant=auto shapes the student from the reference VAE, but use_ref_vae=false: "
                          "name a variant (e.g. model_variant=taehv)")


def valid_frame_counts(config: TrainConfig, limit: int = 64) -> list[int]:
    """Counts whose reference latents decode back to the same frames (models/reference_vae.py:
    4k+1 for hunyuan and wan, 8k+1 for cogvideox; a measured VAE: the counts where the student
    gives its latent and decoded counts). Autoencoder mode needs whole latent frames of the
    student (multiples of its t_downscale; a chunked variant such as taeh3 its own rule)."""
    geometry = measured_geometry(config)
    if geometry is not None:
        from models.vae_geometry import valid_frame_counts as measured_frame_counts

        return measured_frame_counts(geometry, student_of(config), limit)
    if config.use_ref_vae:
        return reference_frame_counts(config.reference_family or config.ref_vae_family, limit)  # before validate: as set
    student_args = student_of(config)
    if student_args.chunk is not None:
        return student_args.valid_frame_counts(limit - 1)
    return [n for n in range(student_args.t_downscale, limit) if n % student_args.t_downscale == 0]


def _nearest(value: int, candidates: list[int]) -> str:
    ordered = sorted(candidates, key=lambda c: (abs(c - value), c))[:2]
    return " or ".join(str(c) for c in sorted(ordered))


def decoded_frame_count(config: TrainConfig) -> int:
    """Frames the student's round trip of an n_frames clip gives back (the reference VAE's rule
    keeps n, a measured one what it decodes to; in autoencoder mode the decoder trims its first
    frames_to_trim outputs)."""
    if config.use_ref_vae and not config.reference_geometry:
        return config.n_frames
    args = student_of(config)
    return args.decoded_frame_count(args.latent_frame_count(config.n_frames))


def latent_space(config: TrainConfig) -> str:
    """The resolved latent space of the reference latents ('' in autoencoder mode)."""
    if not config.use_ref_vae:
        return ""
    geometry = measured_geometry(config)
    if geometry is not None:
        from models.vae_geometry import resolve_latent_space as measured_latent_space

        return measured_latent_space(geometry, config.ref_vae_latent_space)
    return resolve_latent_space(config.reference_family, config.ref_vae_latent_space)


def config_hash(config: TrainConfig) -> str:
    """Short sha256 of the resolved config, recorded with exported models."""
    import hashlib

    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def config_summary(config: TrainConfig) -> str:
    return json.dumps(config.to_dict(), indent=2)


def model_lines(c: TrainConfig) -> list[str]:
    """What the run distills from and into: the reference VAE (measured, for a class no family
    names) and the student model_variant gives or auto chose."""
    args, lines = student_of(c), []
    geometry = measured_geometry(c)
    if geometry is not None:
        lines.append(f"reference VAE measured: {geometry.summary()}; latent space {latent_space(c)}")
    elif c.use_ref_vae:
        lines.append(f"reference VAE: {c.reference_family}, frames {'{}k+{}'.format(*FRAME_RULES[c.reference_family])}, "
                     f"latent space {latent_space(c)}")
    how = "chosen by model_variant=auto" if c.model_variant == "auto" else f"model_variant={c.model_variant}"
    public = "public variant: its weights can start the run" if args.variant in VARIANTS else "no public weights: trained from scratch"
    lines.append(f"student: {args.variant} ({how}; {public}): {args.latent_channels} latent channels, "
                 f"{args.spatial_downscale}x spatial, {args.t_downscale}x in time, "
                 f"{c.n_frames} frames -> {c.latent_frames} latents -> {decoded_frame_count(c)} frames")
    return lines


def largest_bucket(buckets) -> tuple[int, int]:
    """The bucket with the most pixels (the first of equal ones): what memory is planned for."""
    return tuple(max(buckets, key=lambda shape: shape[0] * shape[1]))


def at_largest_bucket(config):
    """The config as the memory, FLOP and shared-memory estimates see it: height x width of the
    largest bucket, no buckets; the config itself when it has none."""
    if not config.buckets:
        return config
    height, width = largest_bucket(config.buckets)
    return dataclasses.replace(config, height=height, width=width, buckets=())
