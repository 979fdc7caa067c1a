"""Loading a config: profile or custom file -> recipe -> stage -> `--set` overrides parsed to each key's type -> validation -> derived values.

    load_config("h100", overrides=["learning_rate=2e-4"], num_processes=8) -> TrainConfig

A profile or custom file is a Python file defining `overrides = dict(key=value, ...)` and, for custom files,
optionally `base_profile = "h100"` to start from a shipped profile.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from typing import Any

from training.base.files import write_json
from training.config.recipes import recipe_values
from training.config.rules import SIZE_LISTS, _names_a_class, fits_by_accumulation, validate
from training.config.schema import (
    CAPPED_TO_MAX_STEPS,
    DERIVED_KEYS,
    FIELD_TYPES,
    PROFILE_DIR,
    SETTABLE_KEYS,
    ConfigError,
    TrainConfig,
    read_accelerate_file,
    tagged,
)
from training.config.views import student_of


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
        from training.config.legacy import legacy_overrides

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
    An old-style `args` file is converted (training/config/legacy.py); `notes` receives what changed."""
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
        # a file's recipe sits between its base profile and its own keys
        recipe = recipe_values(overrides.get("recipe", ""), _distills({**base_overrides, **overrides}))
        overrides = users_data_root({**base_overrides, **recipe, **overrides}, overrides)
    elif overrides.get("recipe"):
        overrides = {**recipe_values(overrides["recipe"], _distills(overrides)), **overrides}
    return overrides, str(path.resolve())


def _distills(values: dict) -> bool:
    return bool(values.get("use_ref_vae", TrainConfig.__dataclass_fields__["use_ref_vae"].default))


def users_data_root(values: dict, layer: dict) -> dict:
    """A data_root chosen in a layer (a config file on a base profile, or --set) is the user's:
    the base profile's sample clips are never made into it, nor swapped for a folder of synthetic
    ones, unless that layer asks for sample_data itself. A misspelt folder is then an error, not a
    new folder of demo clips. The base's validation_sources name its own clips' sources: another
    folder is split by path unless that layer names its sources too."""
    if "data_root" in layer and "sample_data" not in layer:
        values["sample_data"] = ""
    if ("data_root" in layer or "index_path" in layer) and "validation_sources" not in layer:
        values["validation_sources"] = ""
    return values


def _closest(key: str) -> str:
    match = difflib.get_close_matches(key, SETTABLE_KEYS, n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def parse_value(key: str, text: str) -> Any:
    """A `--set key=value` string to the key's type."""
    kind = FIELD_TYPES[key]
    if key == "stages":
        raise ConfigError("--set stages=...: stages are dicts; write them in a config file (docs/howto/finetune.md#stages), "
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
            if key in SIZE_LISTS:  # 256x448,448x256 or 256,448,448,256 (rules.size_pairs pairs them)
                text = text.replace("x", ",")
            return tuple(int(x) for x in text.strip().strip("()").split(",") if x.strip())
        return text
    except ValueError:
        if key.endswith("_schedule"):
            raise ConfigError(f"--set {key}={text}: expected start_step,ramp_steps, e.g. --set {key}=20000,1000, "
                              f"or {key}=() for the full weight from step 0") from None
        if key in SIZE_LISTS:
            raise ConfigError(f"--set {key}={text}: expected heightxwidth pairs, e.g. --set {key}=256x448,448x256,320x320, "
                              f"or {key}=() for none") from None
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


# keys a stage may not set (max_steps comes from its steps): option(..., stage_fixed=True) in schema.py
STAGE_FIXED_KEYS = set(tagged("stage_fixed"))


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
    # --set recipe=NAME (the launcher's --recipe): on the profile, under the stage and --set
    values.update(recipe_values(set_values.get("recipe", ""), _distills({**values, **set_values})))
    for stage in range(1, len(values.get("stages", ())) + 1):  # every stage's keys, before stage 1 starts
        stage_overrides(values["stages"], stage, source)
    values.update(stage_overrides(values.get("stages", ()), set_values.get("stage", values.get("stage", 0)), source))
    users_data_root(values, set_values).update(set_values)
    if "ref_vae_path" in values and "ref_vae_family" not in values and _names_a_class(values["ref_vae_path"]):
        values["ref_vae_family"] = "auto"  # a VAE of one's own: read what it is (a folder without one: the check names it)
    return values, set_values, source




def build_config(values: dict, num_processes: int | None = None, check_paths: bool = True,
                 max_steps_given: bool = False, notes: list[str] | None = None,
                 given: frozenset = frozenset()) -> TrainConfig:
    """Validated TrainConfig with derived values from every settable key's value. The warm-up and
    every interval are capped to max_steps when a stage sets it (at least one of each at its end)
    or the command line does (`max_steps_given`: a quick trial, which `notes` reports). A
    multi-process profile on another process count keeps its global batch (fit_process_count);
    `given` are the keys the command line set, which that leaves as they are."""
    config = TrainConfig(**values)
    # before the rules: they check the schedules at this stage's first step
    config.schedule_offset = sum(dict(entry)["steps"] for entry in config.stages[: max(config.stage - 1, 0)])
    config.num_processes = num_processes if num_processes is not None else (config.supported_num_gpus or (1,))[0]
    if max_steps_given or (config.stages and config.stage):
        capped = [f"{key} {getattr(config, key)} -> {config.max_steps}" for key in CAPPED_TO_MAX_STEPS
                  if getattr(config, key) > config.max_steps]
        for key in CAPPED_TO_MAX_STEPS:
            setattr(config, key, min(getattr(config, key), config.max_steps))
        if capped and max_steps_given and notes is not None:
            notes.append(f"quick trial: max_steps={config.max_steps} caps {', '.join(capped)}")
    fitted = fit_process_count(config, given)
    if fitted and notes is not None:
        notes.append(fitted)
    validate(config, check_paths=check_paths)
    resolve(config)
    if config.adaptive_adversarial and config.seraena_weight > 0 and config.zero_stage == 3:
        raise ConfigError(f"adaptive_adversarial=true with ZeRO-3 ({config.accelerate_config}): the weight reads "
                          "gradients of the decoder's last layer, which ZeRO-3 partitions; use a ZeRO-2 or DDP "
                          "accelerate file, or set adaptive_adversarial=false")
    if config.compile and config.zero_stage == 3:
        raise ConfigError(f"compile=true with ZeRO-3 ({config.accelerate_config}): its parameter gathering hooks break "
                          "the compiled graph; use a ZeRO-2 or DDP accelerate file, or set compile=false")
    return config


def fit_process_count(c: TrainConfig, given: frozenset = frozenset()) -> str:
    """A profile written for several processes (h100: 8; 16gpu_h100: 16) on another count of several
    (24, 32, 128 GPUs): the accumulation that keeps its global batch where that divides, else the
    nearest, said in the line returned ('' when nothing changed). One process is another profile
    (the rules name it). Keys the command line set stay as given."""
    if not fits_by_accumulation(c):
        return ""
    written = c.supported_num_gpus
    head = f"{c.num_processes} processes (profile written for {' or '.join(map(str, written))})"
    per_step = c.batch_size_per_gpu * c.num_processes
    if "gradient_accumulation_steps" in given or "global_batch_size" in given:
        if "global_batch_size" not in given:
            c.global_batch_size = per_step * c.gradient_accumulation_steps
        return ""
    target = c.global_batch_size or c.batch_size_per_gpu * written[0] * c.gradient_accumulation_steps
    before = c.gradient_accumulation_steps
    c.gradient_accumulation_steps = max(1, round(target / per_step))
    c.global_batch_size = per_step * c.gradient_accumulation_steps
    if c.global_batch_size == target:
        return (f"{head}: gradient_accumulation_steps {before} -> {c.gradient_accumulation_steps} keeps the global batch "
                f"of {target} clips")
    accumulation = (f"gradient_accumulation_steps {before} -> {c.gradient_accumulation_steps}" if before != c.gradient_accumulation_steps
                    else f"gradient_accumulation_steps stays {before}")
    return (f"{head}: {target} clips per step do not divide into {c.batch_size_per_gpu} x {c.num_processes}: "
            f"{accumulation}, global batch {c.global_batch_size} "
            f"clips, learning_rate {c.learning_rate:g} unchanged (--set gradient_accumulation_steps=N or learning_rate=... "
            "to choose otherwise)")


def load_config(
    profile_or_path: str, overrides: list[str] | None = None, num_processes: int | None = None, check_paths: bool = True,
    notes: list[str] | None = None,
) -> TrainConfig:
    """Profile -> overrides -> validation -> derived values. Raises ConfigError with one line."""
    values, set_values, _ = launch_values(profile_or_path, overrides)
    return build_config(values, num_processes, check_paths, "max_steps" in set_values, notes, frozenset(set_values))


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


def write_resolved_config(config: TrainConfig, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    return write_json(run_dir / "resolved_config.json", config.to_dict())
