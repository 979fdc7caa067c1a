"""Weight files: reading .pth / .safetensors state dicts, model_info.json and the safetensors
metadata beside or in them, and the construction arguments inferred from tensor shapes alone.
The model imports this module to load its files, so the model these functions take is typed as an
nn.Module (it is a TAEHV): this module never imports the model back."""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn

from models.taehv.blocks import TGrow
from models.variants import BASE_LAYOUT_WIDTHS, LEGACY_EXPORT_STEM, VARIANTS, TAEHVArgs

MODEL_INFO_FILENAME = "model_info.json"


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a .pth or .safetensors TAEHV file, on CPU."""
    if not path.is_file():
        raise FileNotFoundError(f"TAEHV weight file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state_dict = load_file(str(path), device="cpu")
        else:
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated or foreign files raise many different types
        raise ValueError(f"cannot read TAEHV weights from {path}: {error}. Is the file complete?") from error
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(f"{path} is not a plain TAEHV state dict (expected a dict of tensors)")
    return state_dict


def args_metadata(model: nn.Module) -> dict[str, str]:
    """safetensors metadata that makes the file alone say what it is (a variant built for a VAE
    has no name that shapes could tell)."""
    return {"taehv_model_args": json.dumps(model.args.to_json_dict())}


def read_model_info(weights_path: Path) -> TAEHVArgs | None:
    """The construction arguments of model_info.json beside the file, else of the file's own
    safetensors metadata, else None."""
    info_path = weights_path.parent / MODEL_INFO_FILENAME
    if not info_path.is_file():
        if weights_path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(weights_path), "pt") as handle:
                stored = (handle.metadata() or {}).get("taehv_model_args")
            return TAEHVArgs.from_json_dict(json.loads(stored)) if stored else None
        return None
    info = json.loads(info_path.read_text())
    if "model_args" not in info:
        raise ValueError(f"{info_path} has no 'model_args'; delete it or re-export the model")
    return TAEHVArgs.from_json_dict(info["model_args"])


def write_model_info(model: nn.Module, directory: Path, **extra) -> Path:
    """model_info.json: the construction arguments plus any extra fields (step, metrics, ...)."""
    path = Path(directory) / MODEL_INFO_FILENAME
    path.write_text(json.dumps({"model_args": model.args.to_json_dict(), **extra}, indent=2))
    return path


def infer_args_from_state_dict(state_dict: dict[str, torch.Tensor], source: Path | str = "file") -> TAEHVArgs:
    """Construction arguments from tensor shapes alone (see `TAEHV.from_pretrained`)."""
    # "encoder.<i>.conv.weight" (no sub-index) is a TPool, "decoder.<i>.conv.weight" a TGrow: their
    # 1x1 weights are [c, s*c] and [s*c, c], so the time strides need no channel table.
    def time_weights(part: str) -> list[torch.Tensor]:
        found = [(int(m.group(1)), v) for k, v in state_dict.items() if (m := re.fullmatch(rf"{part}\.(\d+)\.conv\.weight", k))]
        return [v for _, v in sorted(found, key=lambda item: item[0])]

    pools, grows = time_weights("encoder"), time_weights("decoder")
    if len(pools) != 3 or len(grows) != 3:
        raise ValueError(f"{source} is not a TAEHV state dict: it has {len(pools)} TPool and {len(grows)} TGrow weights, not 3 and 3")
    try:
        patch_size = round((state_dict["encoder.0.weight"].shape[1] // 3) ** 0.5)
        latent_channels = state_dict["encoder.17.weight"].shape[0]
        if "decoder.0.weight" in state_dict:  # the base layout starts with a parameter-free Clamp
            decoder_kind = "super"
        else:
            width = state_dict["decoder.1.weight"].shape[0]
            kinds = [kind for kind, widths in BASE_LAYOUT_WIDTHS.items() if widths[0] == width]
            if not kinds:
                raise ValueError(f"{source}: first decoder stage has {width} channels, no TAEHV decoder kind has that")
            decoder_kind = kinds[0]
    except KeyError as error:
        raise ValueError(f"{source} is not a TAEHV state dict: key {error} is missing") from error
    encoder_time = tuple(w.shape[1] == 2 * w.shape[0] for w in pools)
    decoder_time = tuple(w.shape[0] == 2 * w.shape[1] for w in grows)
    matches = [a for a in VARIANTS.values() if (a.patch_size, a.latent_channels, a.decoder_kind) == (patch_size, latent_channels, decoder_kind)]
    if not matches:
        raise ValueError(
            f"{source}: no known TAEHV variant has patch_size={patch_size}, latent_channels={latent_channels}, "
            f"decoder={decoder_kind}; pass variant=... and overrides explicitly"
        )
    named = variant_named_by_file(source, [a.variant for a in matches])
    if named is not None:
        chosen = VARIANTS[named]
    else:
        chunked = [a.variant for a in matches if a.chunk is not None]
        if chunked:  # guessing would silently change every frame count
            raise ValueError(
                f"{source}: patch_size={patch_size}, latent_channels={latent_channels} is variant {chunked[0]!r}, whose "
                f"time chunking no tensor shows: pass variant={chunked[0]!r} or keep {MODEL_INFO_FILENAME} beside the file"
            )
        chosen = matches[0]
        if len(matches) > 1:  # e.g. taecvx loaded as taehv would lose the CogVideoX trim rule: say so
            other_rules = [a.variant for a in matches if a.frame_rule() != chosen.frame_rule()]
            warnings.warn(
                f"{source}: its shapes fit {', '.join(a.variant for a in matches)} alike and neither its file name nor a "
                f"{MODEL_INFO_FILENAME} beside it says which: loaded as {chosen.variant!r}"
                + (f" ({', '.join(other_rules)} would decode other frame counts)" if other_rules else "")
                + "; if it is another, pass variant=... (inference.py: --variant)",
                stacklevel=3,
            )
    return replace(chosen, encoder_time_downscale=encoder_time, decoder_time_upscale=decoder_time)


# Our exports were named taehv.pth whatever their variant until 2026-11-28 (now <variant>.pth): without
# the model_info.json beside it, that name alone tells nothing.
EXPORT_FILE_STEM = LEGACY_EXPORT_STEM


def variant_named_by_file(path: Path | str, candidates: list[str]) -> str | None:
    """The candidate a public file name names: its stem is the variant, alone or followed by a
    separator (`taecvx.pth`, `taew2_1.safetensors`, `taecvx_ema.pth`); the longest such name wins."""
    stem = Path(str(path)).name.split(".")[0].lower()
    named = [v for v in candidates if v != EXPORT_FILE_STEM and (stem == v or (stem.startswith(v) and stem[len(v)] in "_-"))]
    return max(named, key=len) if named else None


def narrow_tgrow_weights(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint trained with time upscaling, loaded where that TGrow is disabled: keep the
    output channels of the last time step (they are what a stride-1 TGrow would emit)."""
    target = model.state_dict()
    narrowed = dict(state_dict)
    for name, module in model.named_modules():
        if isinstance(module, TGrow) and module.stride == 1:
            key = f"{name}.conv.weight"
            if key in state_dict and key in target:
                have, want = state_dict[key].shape[0], target[key].shape[0]
                if have > want and have % want == 0:
                    narrowed[key] = state_dict[key][-want:]
    return narrowed
