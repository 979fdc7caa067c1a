"""Checkpoints and exports: what a run saves, where, and how it comes back.

A checkpoint folder holds accelerate's model and optimizer files (DeepSpeed shards under
DeepSpeed), training/elastic.py's full state and topology (for a resume on other process
counts), one <name>_state.pt per stateful part of the run (STATE_NAMES), and each rank's own
Seraena replay buffer and random state (seraena_rank<R>.pt). It is written to a temporary
folder and renamed, so a crash mid-save never leaves a folder that resume would pick. Exports
(final/, best_model/) hold the public-format weights and model_info.json.
"""

from __future__ import annotations

import contextlib

import hashlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from models.taehv import TAEHV
from training.agreement import agree
from training.config import ResumeError, TrainConfig
from training.elastic import save_full_state
from training.run_folder import check_writable, complete_checkpoints

if TYPE_CHECKING:
    from training.training_run import TrainingRun

# the run's stateful parts beyond model and optimizer; older checkpoints numbered them in this order
STATE_NAMES = ("scheduler", "progress", "ema", "seraena")


class Progress:
    """Where the run is, saved with every checkpoint (registered with accelerate): optimizer
    steps, batches drawn (they differ by accumulation and by skipped batches, and the data
    position follows the batches), and the early-stopping record."""

    def __init__(self):
        self.step = 0
        self.micro_step = 0
        self.best_value: float | None = None
        self.best_step = 0
        self.validations_without_improvement = 0
        self.baseline: dict | None = None  # validation metrics of pretrained_model_path, scored once

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.micro_step = int(state.get("micro_step", self.step))
        self.best_value = state.get("best_value")
        self.best_step = int(state.get("best_step", 0))
        self.validations_without_improvement = int(state.get("validations_without_improvement", 0))
        self.baseline = state.get("baseline")


def check_run_folder(config: TrainConfig, resume_from: Path | None, resuming: bool) -> None:
    """The run folder can be written; a fresh start does not land on an earlier run's checkpoints;
    a checkpoint to resume fits this config. Writes nothing."""
    from training import elastic

    run_dir = Path(config.output_dir)
    check_writable(run_dir)
    existing = complete_checkpoints(run_dir) if (run_dir / "checkpoints").is_dir() else []
    if existing and not resuming:
        raise ResumeError(f"{run_dir} already holds {existing[-1].name}: continue it with --resume latest, "
                          "or choose another --output-dir (nothing was changed)")
    if resume_from is not None:
        try:
            elastic.check_resumable(resume_from, config)
        except ValueError as error:
            raise ResumeError(str(error)) from None


def save_checkpoint(run: TrainingRun, step: int) -> Path | None:
    """Written to a temporary folder, then renamed: a crash mid-save never leaves a folder that
    resume would pick. Older checkpoints beyond the limit go only after the new one is complete.
    A failed write (full disk, lost mount) on any rank is agreed by all ranks, logged with the
    ranks it happened on, and returns None: the temporary folder is removed, the previous
    checkpoint stays, and training goes on. It runs under the set-up timeout (nccl_timeout_s),
    not step_timeout_s: every rank writes its part (at 64 GPUs, tens of GB in all) while the others
    wait in the save's collectives, and slow storage must not look like a dead rank."""
    from training.faults import set_collective_timeout  # faults saves the stop checkpoint through here

    config = run.config
    widen = run.step_timeout_set and run.accelerator.num_processes > 1 and config.nccl_timeout_s > config.step_timeout_s
    if widen:
        set_collective_timeout(config.nccl_timeout_s)
    try:
        return _save_checkpoint(run, step)
    finally:
        if widen:
            set_collective_timeout(config.step_timeout_s)


def _save_checkpoint(run: TrainingRun, step: int) -> Path | None:
    accelerator, config, run_dir = run.accelerator, run.config, run.run_dir
    final = run_dir / "checkpoints" / f"checkpoint-{step}"
    temporary = run_dir / "checkpoints" / f".tmp-checkpoint-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)
    accelerator.wait_for_everyone()
    # Every rank first proves it can write there, and the ranks agree: a rank that cannot would
    # otherwise leave the others waiting inside DeepSpeed's save barriers.
    error = writable_problem(temporary, injected=step in run.faults.checkpoint_fail_steps)
    agreed = agree(accelerator, failed=bool(error))
    if not agreed:
        error = save_every_part(run, temporary, step)
        agreed = agree(accelerator, failed=bool(error))
    if agreed:
        if error:
            print(f"rank {accelerator.process_index}: checkpoint at step {step} not written: {error}", file=sys.stderr, flush=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)
        previous = complete_checkpoints(run_dir)
        run.failed_checkpoints += 1
        run.log.line(f"checkpoint at step {step} FAILED {agreed.where('failed')} ({error or 'that rank says why'}); "
                     f"kept {previous[-1].name if previous else 'no earlier checkpoint'}; training continues. "
                     "Free disk space in the run folder")
        return None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        temporary.rename(final)
        for old in complete_checkpoints(run_dir)[: -config.checkpoints_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def save_every_part(run: TrainingRun, temporary: Path, step: int) -> str:
    """Writes the checkpoint's parts into `temporary`; returns this rank's first write error, or ''.
    Every rank runs every part, a failed one included, so the collectives inside the parts match
    (DeepSpeed's save gathers and ends in a barrier; the full state is gathered after it)."""
    accelerator = run.accelerator
    errors = []
    try:
        with run.faults.in_engine_save(run.model, step), engine_writes_recorded(run.model, errors):
            accelerator.save_state(str(temporary))
    except OSError as failure:  # accelerate's own files (DDP: the model, optimizer, random states)
        errors.append(str(failure))
    if run.faults.slow_save_s:  # storage that takes its time, between the engine's files and ours
        time.sleep(run.faults.slow_save_s)
    parts = [lambda: save_full_state(accelerator, run.model, run.optimizer, run.config, run.progress.micro_step, temporary),
             lambda: save_stateful_objects(run, temporary)]
    if run.seraena is not None:  # each rank's own replay buffer (unless left out) and random state
        state = lambda: run.seraena.rank_state_dict(with_buffer=run.config.seraena_buffer_in_checkpoints)  # noqa: E731
        parts.append(lambda: torch.save(state(), temporary / seraena_rank_file(accelerator.process_index)))
    for part in parts:
        try:
            part()
        except OSError as failure:
            errors.append(str(failure))
    return errors[0] if errors else ""


@contextlib.contextmanager
def engine_writes_recorded(engine, errors: list):
    """DeepSpeed's save runs collectives between its file writes (parameter gathers under ZeRO-3,
    a closing barrier): a write that raised on one rank would leave the others waiting in them.
    While this is active its writes record their OSError in `errors` and return, so every rank
    runs the whole save and the ranks agree on the failure afterwards."""
    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    if checkpoint_engine is None:  # not a DeepSpeed engine
        yield
        return
    write, own = checkpoint_engine.save, "save" in vars(checkpoint_engine)

    def recorded(*args, **kwargs):
        try:
            return write(*args, **kwargs)
        except OSError as failure:
            errors.append(str(failure))

    checkpoint_engine.save = recorded
    try:
        yield
    finally:
        if own:
            checkpoint_engine.save = write
        else:
            del checkpoint_engine.save


def stateful_objects(run: TrainingRun) -> dict:
    """The run's state beyond model and optimizer (which accelerate saves), by name, in the
    order of STATE_NAMES; absent parts (no EMA, no Seraena) are left out."""
    named = {"scheduler": run.scheduler, "progress": run.progress, "ema": run.ema, "seraena": run.seraena}
    return {name: named[name] for name in STATE_NAMES if named[name] is not None}


def save_stateful_objects(run: TrainingRun, folder: Path) -> None:
    """<name>_state.pt for each, written by rank 0 (they are identical on every rank). Every rank
    takes the states: the EMA's gathers its partitions (training/distill.py PartitionedEMA)."""
    states = {name: obj.state_dict() for name, obj in stateful_objects(run).items()}
    if run.accelerator.is_main_process:
        for name, state in states.items():
            torch.save(state, folder / f"{name}_state.pt")


def load_stateful_objects(folder: Path, objects: dict) -> None:
    present = list(objects)
    for name, obj in objects.items():
        state = read_state(folder, name, present)
        if state is None:
            raise FileNotFoundError(f"{folder}: no {name}_state.pt: the checkpoint is incomplete or from a run with "
                                    f"other settings (ema_decay, seraena_weight); resume from another checkpoint")
        obj.load_state_dict(state)


def read_state(folder: Path, name: str, present: list[str] | None = None) -> dict | None:
    """The state called `name` in a checkpoint folder, or None. The one reader of checkpoint
    state (resume, scripts/convert_checkpoint.py, inference.py). Checkpoints written before the
    names hold accelerate's custom_checkpoint_<i>.pkl, numbered in STATE_NAMES order among the
    parts that run had: given `present` (a resuming run has the same parts), else recognised by
    content (only the EMA can be)."""
    path = folder / f"{name}_state.pt"
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=False)
    if present is not None:
        legacy = folder / f"custom_checkpoint_{present.index(name)}.pkl" if name in present else None
        return torch.load(legacy, map_location="cpu", weights_only=False) if legacy and legacy.is_file() else None
    if name == "ema":
        for legacy in sorted(folder.glob("custom_checkpoint_*.pkl")):
            state = torch.load(legacy, map_location="cpu", weights_only=False)
            if isinstance(state, dict) and "shadow" in state:
                return state
    return None


def is_checkpoint_folder(folder: Path) -> bool:
    return any(folder.glob("*_state.pt")) or any(folder.glob("custom_checkpoint_*.pkl"))


def seraena_rank_file(rank: int) -> str:
    return f"seraena_rank{rank}.pt"


def load_seraena_rank_state(run: TrainingRun, folder: Path) -> str:
    """This rank's replay buffer and random state from `folder`; returns what was restored, for the log.
    A rank without its file (older checkpoints, or more ranks than the run that wrote it) keeps
    the state it started with, or rank 0's from an older checkpoint."""
    path = folder / seraena_rank_file(run.accelerator.process_index)
    if run.seraena is None or not path.is_file():
        return ""
    state = torch.load(path, weights_only=False)
    run.seraena.load_rank_state_dict(state)
    if "buffer" not in state:
        return "; Seraena random state per rank (the checkpoint holds no replay buffer: it refills from new fakes)"
    return "; Seraena replay buffer and random state per rank"


def writable_problem(folder: Path, injected: bool = False) -> str:
    """'' when this rank can create files in `folder`, else the error (a full disk, a read-only or
    lost mount). `injected` (TAEHV_FAULT_CHECKPOINT_FAIL_STEPS) leaves a partial file and fails."""
    probe = folder / f".probe-{socket.gethostname()}-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if injected:
            probe.write_bytes(b"\0" * 1024)
            raise OSError(28, "No space left on device (injected)")
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as failure:
        return str(failure)
    return ""


def export_info(config: TrainConfig) -> dict:
    """What model_info.json records beside the architecture: the config's hash and, when
    distilling, the reference family and the latent space the weights encode to and decode from."""
    from training.config import config_hash, latent_space

    info = {"config_hash": config_hash(config)}
    if config.use_ref_vae:
        info["reference"] = {"family": config.reference_family, "latent_space": latent_space(config)}
        if config.reference_geometry:  # what was measured of a VAE no family names
            info["reference"]["geometry"] = config.reference_geometry
    return info


def export_model(accelerator, weights: dict, taehv: TAEHV, folder: Path, step: int, metrics: dict, **info) -> None:
    """Public-format weights (.pth and .safetensors) plus model_info.json, written atomically
    by rank 0 (the weights are identical on every rank)."""
    from safetensors.torch import save_file

    from models.taehv import args_metadata, write_model_info

    if not accelerator.is_main_process:
        return
    weights = {k: v.detach().float().cpu().contiguous() for k, v in weights.items()}
    temporary = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        temporary.mkdir(parents=True)
        torch.save(weights, temporary / "taehv.pth")
        save_file(weights, str(temporary / "taehv.safetensors"), metadata=args_metadata(taehv))
        write_model_info(taehv, temporary, step=step, metrics=metrics, **info)
    except OSError:  # a full disk: the previous export stays whole, the half-written one goes
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if folder.exists():
        shutil.rmtree(folder)
    temporary.rename(folder)


def master_weights(accelerator, model) -> dict:
    """The student's weights as the optimizer holds them, fp32, on the training device, on every
    rank: under DeepSpeed its fp32 master copies (ZeRO partitions gathered: a collective), not the
    bf16 copies the forward runs with; otherwise the parameters themselves. Buffers as they are."""
    student = accelerator.unwrap_model(model)
    taehv = student.taehv
    weights = {name: buffer.detach().float() for name, buffer in taehv.named_buffers()}
    trained = [(name, param) for name, param in taehv.named_parameters() if name not in student.frozen_weights]
    if accelerator.state.deepspeed_plugin is not None:
        from deepspeed.utils import safe_get_full_fp32_param

        weights.update({name: safe_get_full_fp32_param(param).detach().float() for name, param in trained})
    else:
        weights.update({name: param.detach().float() for name, param in trained})
    # frozen parts (train_encoder/train_decoder=false): their starting fp32 values, unchanged
    weights.update({name: value.to(accelerator.device) for name, value in student.frozen_weights.items()})
    return weights


def full_state_dict(accelerator, model) -> dict:
    """master_weights as CPU copies, in the module's key order (what exports and fingerprints use)."""
    weights = master_weights(accelerator, model)
    order = accelerator.unwrap_model(model).taehv.state_dict().keys()
    return {k: weights[k].cpu().clone() for k in order if k in weights}


def current_weights(run: TrainingRun) -> dict:
    """The weights that are validated and exported: the EMA when enabled."""
    return run.ema.shadow if run.ema is not None else full_state_dict(run.accelerator, run.model)


def weights_fingerprint(state_dict: dict) -> str:
    """sha256 of the weights (ranks of one job must agree)."""
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        digest.update(key.encode())
        digest.update(state_dict[key].numpy().tobytes())
    return digest.hexdigest()[:16]


def resume(run: TrainingRun, folder: Path) -> None:
    """accelerate's exact path when the checkpoint was written by the same topology; else the
    elastic path (training/elastic.py), checked by re-gathering the loaded state."""
    from training import elastic

    accelerator, config = run.accelerator, run.config
    if elastic.same_topology(folder, accelerator, config):
        if any(folder.glob("custom_checkpoint_*.pkl")):  # the older layout: accelerate reads those files by position
            accelerator.register_for_checkpointing(*stateful_objects(run).values())
            accelerator.load_state(str(folder))
            accelerator._custom_objects.clear()  # later checkpoints write the named files (save_stateful_objects)
        else:
            accelerator.load_state(str(folder))
            load_stateful_objects(folder, stateful_objects(run))
        restored = load_seraena_rank_state(run, folder)
        run.log.line(f"resumed from {folder} at step {run.progress.step}{restored}")
        return
    saved = json.loads((folder / elastic.TOPOLOGY).read_text())
    load_stateful_objects(folder, stateful_objects(run))
    elastic.load_full_state(accelerator, run.model, run.optimizer, folder)
    load_seraena_rank_state(run, folder)
    run.progress.micro_step = elastic.converted_micro_step(folder, accelerator, config)
    loaded = elastic.state_fingerprint(elastic.gather_full_state(accelerator, run.model, run.optimizer))
    if loaded != saved["state_fingerprint"]:
        raise RuntimeError(f"elastic resume from {folder}: the loaded state (fingerprint {loaded}) differs from the "
                           f"saved one ({saved['state_fingerprint']})")
    run.log.line(f"resumed elastically from {folder} at step {run.progress.step}: {saved['num_processes']} processes "
                 f"ZeRO {saved['zero_stage']} -> {accelerator.num_processes} processes ZeRO {config.zero_stage}; "
                 f"weights and optimizer state identical (fingerprint {loaded}); per-rank random states start fresh")

