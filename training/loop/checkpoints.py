"""Checkpoints: save (temporary folder, write probe, agreement, rename, rotation) and resume (exact or
elastic), with the named registry of stateful parts."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from training.base.agreement import agree
from training.config.schema import ResumeError, TrainConfig
from training.run.checkpoint_files import (OLD_RANDOM_STATES, RANDOM_STATES, WRITE_ERRORS, CheckpointFileError,
                                           complete_checkpoints, describe_write_failure, load_file, read_state)
from training.run.elastic import full_state_files, gather_full_state
from training.run.folder import check_writable

if TYPE_CHECKING:
    from training.loop.state import TrainingRun


# the run's stateful parts beyond model and optimizer; older checkpoints numbered them in this order
STATE_NAMES = ("scheduler", "progress", "ema", "seraena")


def check_run_folder(config: TrainConfig, resume_from: Path | None, resuming: bool) -> None:
    """The run folder can be written; a fresh start does not land on an earlier run's checkpoints;
    a checkpoint to resume fits this config. Writes nothing."""
    from training.run import elastic

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


def checkpoint_due(run: TrainingRun, step: int) -> bool:
    """Whether optimizer step `step` is checkpointed: its interval, the last step, a stop every rank
    agreed on, or early stopping."""
    config = run.config
    return step % config.checkpointing_steps == 0 or step == config.max_steps or run.stop.agreed or run.stopped_early


def save_checkpoint(run: TrainingRun, step: int) -> Path | None:
    """Written to a temporary folder, then renamed: a crash mid-save never leaves a folder that
    resume would pick. Older checkpoints beyond the limit go only after the new one is complete.
    A failed write on any rank (a full disk, whose torch.save raises a RuntimeError, a lost mount,
    the rename into place) is agreed by all ranks, logged with the ranks it happened on, and
    returns None: the temporary folder is removed, the previous checkpoint stays, and training
    goes on. It runs under the set-up timeout (nccl_timeout_s),
    not step_timeout_s: every rank writes its part (at 64 GPUs, tens of GB in all) while the others
    wait in the save's collectives, and slow storage must not look like a dead rank."""
    from training.base.failures import set_collective_timeout  # faults saves the stop checkpoint through here

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
        for leftover in [temporary, *final.parent.glob(".removing-checkpoint-*")]:  # a removal a crash cut short
            shutil.rmtree(leftover, ignore_errors=True)
    accelerator.wait_for_everyone()
    # Every rank first proves it can write there, and the ranks agree: a rank that cannot would
    # otherwise leave the others waiting inside DeepSpeed's save barriers.
    error = writable_problem(temporary, lambda probe: run.seams.fire("checkpoint_probe", probe, step))
    agreed = agree(accelerator, failed=bool(error))
    if not agreed:
        error = save_every_part(run, temporary, step)
        agreed = agree(accelerator, failed=bool(error))
    if not agreed:  # every file is written: rank 0 moves the folder into place, and says whether it could
        error = move_into_place(temporary, final) if accelerator.is_main_process else ""
        agreed = agree(accelerator, failed=bool(error))
    if agreed:
        return failed_checkpoint(run, step, temporary, error, agreed)
    if accelerator.is_main_process:
        for old in complete_checkpoints(run_dir)[: -config.checkpoints_total_limit]:
            remove_checkpoint(old)
    accelerator.wait_for_everyone()
    return final


def failed_checkpoint(run: TrainingRun, step: int, temporary: Path, error: str, agreed) -> None:
    """A write failed on some rank (every rank knows which): its temporary folder goes, the last
    complete checkpoint stays the latest, one line says so, and training goes on."""
    accelerator = run.accelerator
    if error:
        print(f"rank {accelerator.process_index}: checkpoint at step {step} not written: {error}", file=sys.stderr, flush=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)
    previous = complete_checkpoints(run.run_dir)
    run.failed_checkpoints += 1
    run.log.line(f"checkpoint at step {step} FAILED {agreed.where('failed')} ({error or 'that rank says why'}); "
                 f"kept {previous[-1].name if previous else 'no earlier checkpoint'}; training continues. "
                 "Free disk space in the run folder")
    return None


def move_into_place(temporary: Path, final: Path) -> str:
    """The complete folder renamed to its checkpoint name; '' or the error. A folder already of that
    name (a resumed run saving its step again) is set aside first and comes back when the rename
    fails, so a failure never leaves the step without its complete checkpoint."""
    aside = final.with_name(f".old-{final.name}")
    try:
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
            final.rename(aside)
        temporary.rename(final)
    except OSError as failure:
        if aside.exists() and not final.exists():
            aside.rename(final)
        return describe_write_failure(failure, final)
    shutil.rmtree(aside, ignore_errors=True)
    return ""


def remove_checkpoint(folder: Path) -> None:
    """Renamed out of the checkpoint names first: a removal cut short never leaves half a folder
    that resume would take for a complete checkpoint."""
    gone = folder.with_name(f".removing-{folder.name}")
    try:
        folder.rename(gone)
    except OSError:
        return  # kept whole; the next checkpoint's rotation tries again
    shutil.rmtree(gone, ignore_errors=True)


def save_every_part(run: TrainingRun, temporary: Path, step: int) -> str:
    """Writes the checkpoint's files into `temporary`; returns this rank's first write error, or ''.
    Every collective of the save (DeepSpeed's gathers of the full state, the partitioned EMA's)
    runs first, on every rank; then each rank writes its own files, so a failed write leaves no
    rank waiting in a collective. Each tensor is written once (training/run/elastic.py). A write
    fails as a full disk makes it fail: OSError, or torch.save's RuntimeError (which names no errno)."""
    accelerator, rank = run.accelerator, run.accelerator.process_index
    writer = accelerator.is_main_process
    full_state = gather_full_state(accelerator, run.model, run.optimizer, to_host=writer)
    states = {name: obj.state_dict() for name, obj in stateful_objects(run).items()}  # the EMA's gathers its partitions
    files = {}  # file name -> writer(path)
    if writer:
        files.update(full_state_files(full_state, accelerator, run.config, run.progress.micro_step))
        files.update({f"{name}_state.pt": (lambda path, state=state: torch.save(state, path)) for name, state in states.items()})
    # each rank's random states and accelerate's step counter, as plain values and tensors
    generators = random_states(accelerator)
    files[RANDOM_STATES.format(rank=rank)] = lambda path: torch.save(generators, path)
    if run.seraena is not None:  # each rank's own replay buffer (unless left out) and random state
        own = run.seraena.rank_state_dict(with_buffer=run.config.seraena_buffer_in_checkpoints)
        files[seraena_rank_file(rank)] = lambda path: torch.save(own, path)
    for name, write in files.items():
        try:
            run.seams.fire("checkpoint_write", temporary / name, step)
            write(temporary / name)
        except WRITE_ERRORS as failure:
            return describe_write_failure(failure, temporary / name)
    return ""


def stateful_objects(run: TrainingRun) -> dict:
    """The run's state beyond model and optimizer (full_state.pt), by name, in the
    order of STATE_NAMES; absent parts (no EMA, no Seraena) are left out."""
    named = {"scheduler": run.scheduler, "progress": run.progress, "ema": run.ema, "seraena": run.seraena}
    return {name: named[name] for name in STATE_NAMES if named[name] is not None}


def load_stateful_objects(folder: Path, objects: dict) -> None:
    present = list(objects)
    for name, obj in objects.items():
        state = read_state(folder, name, present)
        if state is None:
            raise ResumeError(f"{folder}: no {name}_state.pt: the checkpoint is incomplete or from a run with "
                              f"other settings (ema_decay, seraena_weight); resume from another checkpoint")
        obj.load_state_dict(state)


def seraena_rank_file(rank: int) -> str:
    return f"seraena_rank{rank}.pt"


def load_seraena_rank_state(run: TrainingRun, folder: Path) -> str:
    """This rank's replay buffer and random state from `folder`; returns what was restored, for the log.
    A rank without its file (older checkpoints, or more ranks than the run that wrote it) keeps
    the state it started with, or rank 0's from an older checkpoint."""
    path = folder / seraena_rank_file(run.accelerator.process_index)
    if run.seraena is None or not path.is_file():
        return ""
    state = load_file(path)
    run.seraena.load_rank_state_dict(state)
    if "buffer" not in state:
        return "; Seraena random state per rank (the checkpoint holds no replay buffer: it refills from new fakes)"
    return "; Seraena replay buffer and random state per rank"


def writable_problem(folder: Path, before_write=lambda probe: None) -> str:
    """'' when this rank can create files in `folder`, else the error (a full disk, a read-only or
    lost mount). `before_write(probe)` is the checkpoint_probe seam (training/base/seams.py)."""
    probe = folder / f".probe-{socket.gethostname()}-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        before_write(probe)
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as failure:
        return str(failure)
    return ""


def resume(run: TrainingRun, folder: Path) -> None:
    """Every checkpoint this trainer has written since it wrote full_state.pt resumes through it:
    weights and AdamW's moments by parameter name on any topology (training/run/elastic.py), the
    named states (or the positional custom_checkpoint_<i>.pkl of the oldest layout), each rank's
    Seraena state. On the topology that wrote it each rank's random states come back too (the
    exact resume); on another, the data position is converted by samples consumed. Either way the
    loaded state is gathered again and must have the fingerprint the checkpoint recorded. Model and
    optimizer files that accelerate or DeepSpeed wrote beside it in older checkpoints are not read.
    A file that is not data only stops the resume in one line naming it (ResumeError)."""
    try:
        _resume(run, folder)
    except CheckpointFileError as error:
        raise ResumeError(str(error)) from None


def _resume(run: TrainingRun, folder: Path) -> None:
    from training.run import elastic

    accelerator, config = run.accelerator, run.config
    exact = elastic.same_topology(folder, accelerator, config)
    load_stateful_objects(folder, stateful_objects(run))
    for group, lr in zip(run.scheduler.optimizer.param_groups, run.scheduler.get_last_lr()):
        group["lr"] = lr  # the schedule's rate (the optimizer's own settings are this run's)
    elastic.load_full_state(accelerator, run.model, run.optimizer, folder)
    restored = load_seraena_rank_state(run, folder)
    saved = json.loads((folder / elastic.TOPOLOGY).read_text())
    if exact:
        load_random_states(accelerator, folder)
    else:
        run.progress.micro_step = elastic.converted_micro_step(folder, accelerator, config)
    loaded = elastic.state_fingerprint(elastic.gather_full_state(accelerator, run.model, run.optimizer))
    if loaded != saved.get("state_fingerprint", loaded):
        raise RuntimeError(f"resume from {folder}: the loaded state (fingerprint {loaded}) differs from the "
                           f"saved one ({saved['state_fingerprint']})")
    if exact:
        run.log.line(f"resumed from {folder} at step {run.progress.step} (weights and optimizer state identical: "
                     f"fingerprint {loaded}){restored}")
        return
    run.log.line(f"resumed elastically from {folder} at step {run.progress.step}: {saved['num_processes']} processes "
                 f"ZeRO {saved['zero_stage']} -> {accelerator.num_processes} processes ZeRO {config.zero_stage}; "
                 f"weights and optimizer state identical (fingerprint {loaded}); per-rank random states start fresh")


def random_states(accelerator) -> dict:
    """This rank's generators as tensors and plain values (a checkpoint loads them as data only):
    Python's, NumPy's legacy one, torch's CPU and CUDA ones, with accelerate's step counter (its
    accumulation position) and the fp16 gradient scaler's state when there is one."""
    import numpy

    kind, key, position, has_gauss, gauss = numpy.random.get_state()
    states = {"step": accelerator.step, "python": random.getstate(), "torch": torch.get_rng_state(),
              "numpy": {"kind": str(kind), "key": torch.from_numpy(key.astype(numpy.int64)), "position": int(position),
                        "has_gauss": int(has_gauss), "gauss": float(gauss)}}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    if accelerator.scaler is not None:
        states["scaler"] = accelerator.scaler.state_dict()
    return states


def load_random_states(accelerator, folder: Path) -> None:
    """This rank's random states and accelerate's step counter, from its random_states_<rank>.pt, or
    from the random_states_<rank>.pkl accelerate wrote in older checkpoints (and their scaler.pt)."""
    import numpy

    rank = accelerator.process_index
    path = folder / RANDOM_STATES.format(rank=rank)
    if path.is_file():
        states = load_file(path)
        saved = states["numpy"]
        numpy_state = (saved["kind"], saved["key"].numpy().astype(numpy.uint32), saved["position"], saved["has_gauss"],
                       saved["gauss"])
        python, cpu, cuda, scaler = states["python"], states["torch"], states.get("cuda"), states.get("scaler")
    else:
        path = folder / OLD_RANDOM_STATES.format(rank=rank)
        if not path.is_file():
            raise ResumeError(f"{folder}: no {RANDOM_STATES.format(rank=rank)}: the checkpoint is incomplete; "
                              "resume from another checkpoint")
        states = load_file(path)
        python, numpy_state, cpu = states["random_state"], states["numpy_random_seed"], states["torch_manual_seed"]
        cuda = states.get("torch_cuda_manual_seed")
        scaler = load_file(folder / "scaler.pt") if (folder / "scaler.pt").is_file() else None
    random.setstate(python)
    numpy.random.set_state(numpy_state)
    torch.set_rng_state(cpu)
    if cuda is not None and torch.cuda.is_available():
        for device, state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
    if scaler is not None and accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(scaler)
    accelerator.step = states.get("step", accelerator.step)
