"""Exports in the public TAEHV format (final/, best_model/): the weights being trained, written with
their metadata."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from models.taehv import TAEHV
from training.config.schema import TrainConfig
from training.run.checkpoint_files import describe_write_failure
from training.step.weights import full_state_dict

if TYPE_CHECKING:
    from training.loop.state import TrainingRun


def export_info(config: TrainConfig) -> dict:
    """What model_info.json records beside the architecture: the config's hash and, when
    distilling, the reference family and the latent space the weights encode to and decode from."""
    from training.config.views import config_hash, latent_space

    info = {"config_hash": config_hash(config)}
    if config.use_ref_vae:
        info["reference"] = {"family": config.reference_family, "latent_space": latent_space(config)}
        if config.reference_geometry:  # what was measured of a VAE no family names
            info["reference"]["geometry"] = config.reference_geometry
    return info


def export_model(accelerator, weights: dict, taehv: TAEHV, folder: Path, step: int, metrics: dict, **info) -> None:
    """Public-format weights as `<variant>.pth` and `<variant>.safetensors` (the name upstream's
    taehv.py builds the architecture from) plus model_info.json, written atomically by rank 0 (the
    weights are identical on every rank)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from models.taehv import args_metadata, write_model_info
    from models.variants import export_file_names

    if not accelerator.is_main_process:
        return
    weights = {k: v.detach().float().cpu().contiguous() for k, v in weights.items()}
    temporary = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir(parents=True)
        pth, safetensors = export_file_names(taehv.args.variant)
        torch.save(weights, temporary / pth)
        save_file(weights, str(temporary / safetensors), metadata=args_metadata(taehv))
        write_model_info(taehv, temporary, step=step, metrics=metrics, **info)
    except (OSError, RuntimeError, SafetensorError) as failure:  # a full disk: the previous export stays whole,
        shutil.rmtree(temporary, ignore_errors=True)  # the half-written one goes
        if isinstance(failure, OSError):
            raise
        # torch.save and safetensors report a full disk as their own errors: the callers catch OSError
        raise OSError(describe_write_failure(failure, temporary)) from failure
    if folder.exists():
        shutil.rmtree(folder)
    temporary.rename(folder)


def current_weights(run: TrainingRun) -> dict:
    """The weights that are validated and exported: the EMA when enabled."""
    return run.ema.shadow if run.ema is not None else full_state_dict(run.accelerator, run.model)
