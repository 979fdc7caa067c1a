"""Old-style configs: the `args = EasyDict()` files of the original training scripts, read as profiles.

    from easydict import EasyDict
    args = EasyDict()
    args.train_batch_size = 2
    args.n_frames = 12

A config module that defines `args` and no `overrides` is legacy. `convert_legacy_args` maps each
old key through LEGACY_KEYS to a TrainConfig key (keys whose name did not change are taken as they
are), lowers n_frames to the frame rule, checks mixed_precision against the accelerate file, and
returns the overrides with notes that say what was renamed, adjusted or dropped. The result starts
from the base values (the h100 profile) with a derived global batch and any process count, as the
old scripts ran on any GPU count. scripts/convert_config.py writes it as a profile module.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from models.reference_families import FRAME_RULES
from training.config.schema import (
    ACCELERATE_CONFIG_DIR,
    FIELD_TYPES,
    SETTABLE_KEYS,
    ConfigError,
    TrainConfig,
    read_accelerate_file,
    tagged,
)
from training.config.views import valid_frame_counts


class LegacyKey(NamedTuple):
    new: str | None  # the TrainConfig key; None when it is not a config key
    note: str = ""  # why, where meaning or units changed or the key is dropped
    also: tuple = ()  # (key, value) pairs the old key implies


# Old keys that map 1:1 to a config key are declared on it: option(..., legacy="old name") in schema.py.
# Here: the old keys whose mapping needs a word (meaning, units or neighbours changed) or that are no config key.
LEGACY_SPECIAL: dict[str, LegacyKey] = {
    "train_batch_size": LegacyKey("batch_size_per_gpu", "clips per process per micro-step, as before"),
    "perceptual_loss_weight": LegacyKey("perceptual_weight",
                                        "> 0 needs the LPIPS files: lpips_backbone_path and lpips_weights_path"),
    "use_seraena": LegacyKey("seraena_weight",
                             "False sets seraena_weight=0; True keeps the weight (a term is on while its weight is > 0)"),
    "cogvideox_model_path": LegacyKey("ref_vae_path", "the reference VAE family is now a key of its own",
                                      also=(("ref_vae_family", "cogvideox"),)),
    "annotation_file": LegacyKey("index_path", "JSON, JSONL or CSV index"),
    "n_frames": LegacyKey("n_frames",
                          "lowered to the largest count the frame rule allows (cogvideox 8k+1: 12 -> 9), so no more memory"),
    "output_dir": LegacyKey("output_dir", "train_taehv_h100.sh replaces it with `--output-dir` (default `output/<timestamp>`)"),
    "nccl_timeout": LegacyKey("nccl_timeout_s", "seconds"),
    # --- not config keys
    "resume_from_checkpoint": LegacyKey(None, "a launcher option: `train_taehv_h100.sh ... --resume PATH` (or `latest`)"),
    "mixed_precision": LegacyKey(None, "comes from the accelerate file (accelerate_config); must equal its precision"),
    "report_to": LegacyKey(None, "TensorBoard is always on, in `<run>/logs/`"),
    "logging_dir": LegacyKey(None, "logs are always written to `<run>/logs/`"),
    "tracker_project_name": LegacyKey(None, "TensorBoard needs no project name"),
    "allow_tf32": LegacyKey(None, "TF32 is always on for GPUs"),
}

# Every old key, in the order of the keys they map to in TrainConfig (docs/configuration.md lists them
# so); the old keys that are no config key last.
_ONE_TO_ONE = {old: LegacyKey(new) for new, old in tagged("legacy").items()}
_ORDER = {key: i for i, key in enumerate(FIELD_TYPES)}
LEGACY_KEYS: dict[str, LegacyKey] = dict(sorted({**_ONE_TO_ONE, **LEGACY_SPECIAL}.items(),
                                                key=lambda item: _ORDER.get(item[1].new, len(_ORDER))))

# Old configs ran on any GPU count: no process count check (supported_num_gpus=()), batch derived.
LEGACY_BASE = {"supported_num_gpus": (), "global_batch_size": 0}
LEGACY_BASE_REASON = "old configs ran on any GPU count: any process count, global batch derived"


@dataclass
class LegacyConversion:
    overrides: dict = field(default_factory=dict)  # new key -> value, in the order of the old file
    origins: dict = field(default_factory=dict)  # new key -> the old key it came from (and why it changed)
    dropped: list = field(default_factory=list)  # old keys that are not config keys, with what to do instead
    notes: list = field(default_factory=list)  # what was renamed, adjusted or dropped, for the user


def is_legacy_namespace(namespace: dict) -> bool:
    return "args" in namespace and "overrides" not in namespace


def args_as_dict(args: Any) -> dict:
    """EasyDict and dict as they are; any other object by its public attributes."""
    items = args if isinstance(args, dict) else {k: v for k, v in vars(args).items() if not k.startswith("_")}
    return {key: value for key, value in items.items() if value is not None}  # None means "not set"


def _suggestions(key: str) -> str:
    matches = difflib.get_close_matches(key, sorted(set(SETTABLE_KEYS) | set(LEGACY_KEYS)), n=3, cutoff=0.5)
    return f" (did you mean {' or '.join(matches)}?)" if matches else " (no similar key)"


def _plain(key: str, value: Any) -> Any:
    """Values as the new keys' types expect them: paths as text, 1e5 steps as an int."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if FIELD_TYPES[key] is int and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _frame_rule(config: TrainConfig) -> str:
    if not config.use_ref_vae:
        return "autoencoder mode needs a multiple of 4"
    return "{} needs {}k+{}".format(config.ref_vae_family, *FRAME_RULES[config.ref_vae_family])


def accelerate_files_with_precision(precision: str) -> list[str]:
    return sorted(p.name for p in ACCELERATE_CONFIG_DIR.glob("*.yaml")
                  if str(read_accelerate_file(p.name).get("mixed_precision", "no")) == precision)


def convert_legacy_args(args: Any, source: str = "legacy config") -> LegacyConversion:
    """An old `args` object to overrides of the base values. Raises ConfigError with one line."""
    old = args_as_dict(args)
    unknown = [key for key in old if key not in LEGACY_KEYS and key not in SETTABLE_KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown keys in args: " + ", ".join(key + _suggestions(key) for key in unknown))
    result = LegacyConversion(overrides=dict(LEGACY_BASE), origins=dict.fromkeys(LEGACY_BASE, LEGACY_BASE_REASON))
    set_by: dict[str, str] = {}  # new key -> old key, so two old keys cannot set one key differently

    def assign(old_key: str, new_key: str, value: Any) -> None:
        value = _plain(new_key, value)
        if new_key in set_by and result.overrides[new_key] != value:
            raise ConfigError(f"{source}: args.{set_by[new_key]} and args.{old_key} both set {new_key} "
                              f"({result.overrides[new_key]!r} vs {value!r}): keep one")
        set_by[new_key] = old_key
        result.overrides[new_key] = value
        result.origins[new_key] = f"old {old_key}"

    def drop(old_key: str, why: str) -> None:
        result.dropped.append(f"{old_key}={old[old_key]!r} ({why})")
        result.notes.append(f"{old_key}={old[old_key]!r} not applied ({why})")

    for old_key, value in old.items():
        entry = LEGACY_KEYS.get(old_key, LegacyKey(old_key))  # a new key written in the old file
        if old_key in ("use_seraena", "mixed_precision"):
            continue  # decided below, once every other key is known
        if entry.new is None:
            drop(old_key, entry.note)
            continue
        assign(old_key, entry.new, value)
        for new_key, implied in entry.also:
            assign(old_key, new_key, implied)
        if old_key != entry.new or entry.also:
            implied = "".join(f", {k}={v!r}" for k, v in entry.also)
            reason = f" ({entry.note})" if entry.note else ""
            result.notes.append(f"{old_key}={value!r} -> {entry.new}={result.overrides[entry.new]!r}{implied}{reason}")

    if "use_seraena" in old and not old["use_seraena"]:  # the old switch turned the term off, whatever its weight
        result.overrides["seraena_weight"] = 0.0
        result.origins["seraena_weight"] = "old use_seraena=False"
        result.notes.append("use_seraena=False -> seraena_weight=0.0 (the term is off when its weight is 0; "
                            "this wins over any seraena weight in the file)")
    elif "use_seraena" in old:
        drop("use_seraena", "Seraena is on while seraena_weight > 0")
    resulting = TrainConfig(**result.overrides)
    if isinstance(old.get("n_frames"), int) and (resulting.ref_vae_family in FRAME_RULES or not resulting.use_ref_vae):
        _lower_to_valid_frame_count(result, resulting)
    if "mixed_precision" in old:
        _check_precision(str(old["mixed_precision"]), resulting.accelerate_config, source)
        drop("mixed_precision", f"comes from accelerate_config {resulting.accelerate_config!r}, which has it")
    return result


def _lower_to_valid_frame_count(result: LegacyConversion, resulting: TrainConfig) -> None:
    """The largest count the frame rule allows, not above the old one: no more memory than before."""
    frames = valid_frame_counts(resulting, limit=max(64, resulting.n_frames + 1))
    lower = [n for n in frames if n <= resulting.n_frames]
    if resulting.n_frames in frames or not lower:
        return  # valid already, or below every valid count: validate() names the choices
    reason = (f"{_frame_rule(resulting)}; {max(lower)} is the largest valid count not above {resulting.n_frames}, "
              "so no more memory")
    result.notes.append(f"n_frames={resulting.n_frames} -> {max(lower)} ({reason})")
    result.origins["n_frames"] = f"old n_frames={resulting.n_frames} ({reason})"
    result.overrides["n_frames"] = max(lower)


def _check_precision(wanted: str, accelerate_config: str, source: str) -> None:
    """Precision comes from the accelerate file; an old value that differs names the files that have it."""
    if not (ACCELERATE_CONFIG_DIR / accelerate_config).is_file():
        return  # validate() names a missing file
    actual = str(read_accelerate_file(accelerate_config).get("mixed_precision", "no"))
    if wanted != actual:
        choices = ", ".join(accelerate_files_with_precision(wanted)) or "none; add one"
        raise ConfigError(f"{source}: mixed_precision={wanted!r} differs from {actual!r} of accelerate_config "
                          f"{accelerate_config!r} (precision comes from the accelerate file): set args.accelerate_config "
                          f"to one with {wanted!r} in accelerate_configs/ ({choices}), or drop args.mixed_precision")


def legacy_overrides(args: Any, source: str = "legacy config") -> tuple[dict, list[str]]:
    """(overrides, notes) of an old `args` object: what training/config/schema.py reads a legacy file as."""
    conversion = convert_legacy_args(args, source)
    return conversion.overrides, conversion.notes


def legacy_markdown() -> list[str]:
    """The section of docs/configuration.md on old-style files, from LEGACY_KEYS."""
    lines = [
        "",
        "## Old-style `args` configs",
        "",
        "A config file of the original scripts (`from easydict import EasyDict`, `args = EasyDict()`,",
        "`args.train_batch_size = 2`, ...) runs as it is with `train_taehv_h100.sh 8 custom old_config.py`,",
        "which prints what changed as `legacy config:` lines.",
        "`python scripts/convert_config.py old_config.py -o training/configs/my_run.py` writes the",
        "equivalent profile module, one key per line with the old key as a comment.",
        "Keys whose name did not change (e.g. `validation_steps`) are read as they are, `None` means not",
        "set, and any other key is an error naming the closest keys; the result starts from the base",
        "values with `global_batch_size=0` (derived) and any process count, as the old scripts ran on any",
        "GPU count.",
        "",
        "| old key | new key | note |",
        "|---|---|---|",
    ]
    for old_key, entry in LEGACY_KEYS.items():
        new = f"`{entry.new}`" if entry.new else "(not a config key)"
        new += "".join(f", `{key}={value!r}`" for key, value in entry.also)
        lines.append(f"| `{old_key}` | {new} | {entry.note} |")
    return lines
