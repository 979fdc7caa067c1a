"""Memory you can see before you launch: GPU and host memory per rank, and checkpoint size, of a
resolved config. Unit: GB = 1e9 bytes everywhere (logs, dry run, docs).

The training step is measured, not scaled: one full micro-step of the student at the config's
exact shape (batch_size_per_gpu x n_frames x height x width; with aspect buckets, the largest
bucket's), dtype, memory layout
(channels_last) and gradient checkpointing, with every loss term (LPIPS, Seraena's
discriminator step and correction) and the backward, runs on fake tensors (torch's
FakeTensorMode: shapes, dtypes and strides without data or compute; seconds on a CPU) while
StepPeak counts the bytes of every live tensor storage. Its peak, less the weights, is the
"training step" part; tests/test_memory.py checks it against the same count over real tensors
at a small shape, and tests/test_gpu.py against torch.cuda.max_memory_allocated. The rest is
arithmetic on the parameter count and the accelerate file's engine:

| part | bytes |
|---|---|
| weights | params x 2 (bf16) or 4 |
| gradients | DDP: its bucket copy of the gradients, params x 4 (the gradients are in the step); ZeRO-2/3: the fp32 accumulation partition, params x 4 / processes, plus DeepSpeed's reduce bucket, sized to the student by training/loop/build.py (ZeRO-2: one, bf16, overlap_comm off; ZeRO-3: one, fp32; deepspeed_bucket_bytes) |
| optimizer | fp32 master (bf16 engines) and AdamW's two moments: params x (4 + 8), / processes under ZeRO |
| EMA | params x 4, / processes under ZeRO-1/2 (each rank averages its own partition) |
| LPIPS | AlexNet + heads in fp32 when perceptual_weight > 0 |
| reference VAE | its weights in bf16 when it runs on the fly; its encode, measured, where it exceeds the step |
| cuDNN workspace | an allowance of 1 GB for convolution algorithms' scratch memory |
| CUDA context and allocator slack | 1.5 GB |

Host per rank: the Seraena replay buffer (uint8 frame groups, bf16 contexts; its capacity is
capped by seraena_buffer_gb; one slab of capacity x entry bytes at the largest bucket, pinned on
CUDA, allocated whole at its first entry, and a staging slab for one step's fakes), the batches the
data workers hold, and a process baseline.
Checkpoint: weights, optimizer state, EMA, and every rank's replay buffer (one file per rank: the
entries it holds by the run's last checkpoint, up to its capacity).
The reference VAE's encode of one batch, when it runs on the fly, is measured the same way (its
published architecture from diffusers, bf16): it runs before the student's step and is freed
before it, so only what exceeds the step counts. Not measured: allocator fragmentation; the
shipped profiles keep to 90% of their device by this measure.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from models.measure_cache import cached_measurement
from models.reference_families import FAMILY
from training.config.schema import measured_keys
from training.config.terms import discriminator_start, needs_module
from training.config.views import at_largest_bucket, measured_geometry, measured_values, student_of
from training.step.seraena import replay_buffer_bytes, replay_capacity, replay_pair_bytes, replay_staging_bytes

GB = 1e9


CUDA_CONTEXT_GB = 1.5


CUDNN_WORKSPACE_GB = 1.0


HOST_BASELINE_GB = 3.0  # python, torch, CUDA libraries, the model copies of one rank process


MEASURED_VAE_PARAMS = 250e6  # a VAE no family names (ref_vae_family=auto, measured): the families' records say theirs


LPIPS_PARAMS = 2.47e6 + 0.0015e6  # AlexNet features + linear heads


HEADROOM = 0.9  # shipped profiles and suggested fixes keep to 90% of gpu_memory_gb: fragmentation, the reference encode


@dataclass
class MemoryEstimate:
    gpu: dict = field(default_factory=dict)  # part -> GB per rank
    host: dict = field(default_factory=dict)
    checkpoint_gb: float = 0.0
    checkpoint_replay_gb: float = 0.0  # of which the replay buffers of every rank
    checkpoints_kept: int = 1
    checkpoint: "CheckpointCost | None" = None
    reference_encode_gb: float = 0.0  # the reference VAE's encode of one batch on the fly (measured), 0 without one
    note: str = ""

    @property
    def gpu_gb(self) -> float:
        return sum(self.gpu.values())

    @property
    def host_gb(self) -> float:
        return sum(self.host.values())

    def lines(self, budget_gb: float | None) -> list[str]:
        def parts(values: dict) -> str:
            return ", ".join(f"{name} {value:.2f}" for name, value in values.items() if value >= 0.005)

        budget = f" of {budget_gb:g} GB (gpu_memory_gb)" if budget_gb else ""
        if budget_gb and HEADROOM * budget_gb < self.gpu_gb <= budget_gb:
            budget += " (above 90%: fragmentation and the reference VAE's encode are not in it; gradient_checkpointing=true lowers it)"
        encode = (f" (the reference VAE's encode of a batch measures {self.reference_encode_gb:.1f} GB, before the step)"
                  if self.reference_encode_gb else f" ({self.note})" if self.note else "")
        return [f"GPU per rank:  {self.gpu_gb:.1f} GB{budget}: {parts(self.gpu)}{encode}",
                f"host per rank: {self.host_gb:.1f} GB: {parts(self.host)}",
                f"checkpoint:    {self.checkpoint_gb:.2f} GB per checkpoint folder, {self.checkpoint_gb * self.checkpoints_kept:.2f} GB "
                f"for the {self.checkpoints_kept} kept (checkpoints_total_limit)"
                + (f"; the replay buffers are {self.checkpoint_replay_gb:.2f} GB of each (seraena_buffer_in_checkpoints=false "
                   "leaves them out: a resume refills the buffer)" if self.checkpoint_replay_gb >= 0.5 * self.checkpoint_gb > 0 else "")
                + (f"; rank 0 writes {self.checkpoint.rank0_bytes / GB:.2f} GB after {self.checkpoint.collectives} blocking "
                   f"all-reduces ({self.checkpoint.allreduce_bytes_per_rank / GB:.2f} GB through each rank): about "
                   f"{self.checkpoint.seconds():.1f} s" if self.checkpoint else "")]


def _training_dtype(config) -> torch.dtype:
    return torch.bfloat16 if config.mixed_precision == "bf16" else torch.float16 if config.mixed_precision == "fp16" else torch.float32


class StepPeak(TorchDispatchMode):
    """Live and peak bytes of tensor storages, real or fake: each storage counted once, from the op
    that creates it until Python drops it (weakref finalizers). Data-dependent reads of fake tensors
    (a finiteness check's .item()) answer 1: the measured path is the healthy one."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.storages = WeakIdKeyDictionary()

    def count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage in self.storages:
            return
        size = storage.nbytes()
        self.storages[storage] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, size)

    def _release(self, size: int) -> None:
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor

        if func is torch.ops.aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            return 1
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.count(item)
        return out


def measure_step(config, fake: bool = True, batch: int | None = None, height: int | None = None,
                 width: int | None = None) -> tuple[int, int]:
    """(weight bytes, peak bytes) of one training micro-step of `config` (forward, every loss term,
    Seraena's discriminator step and correction, backward): at the config's shape by default, on
    fake tensors unless fake=False. The module is in the dtype the engine trains it in (DeepSpeed
    casts it to bf16; DDP keeps fp32 under autocast)."""
    import contextlib

    from torch._subclasses.fake_tensor import FakeTensorMode

    from models.metrics import LPIPS
    from models.taehv import TAEHV
    from training.step.losses import Student, add_seraena_term, forward_losses
    from training.step.seraena import SeraenaState

    engine_casts = config.zero_stage > 0
    dtype = _training_dtype(config) if engine_casts else torch.float32
    autocast = not engine_casts and config.mixed_precision in ("bf16", "fp16")
    shape = (batch or config.batch_size_per_gpu, config.n_frames, 3, height or config.height, width or config.width)
    default_dtype = torch.get_default_dtype()
    with FakeTensorMode() if fake else contextlib.nullcontext(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        torch.set_default_dtype(dtype)  # built in its dtype: a module .to() cannot convert fake parameters
        try:
            taehv = TAEHV(student_of(config)).set_gradient_checkpointing(config.gradient_checkpointing).train()
        finally:
            torch.set_default_dtype(default_dtype)
        taehv.set_fast_path(config.channels_last, "")
        for part in ("encoder", "decoder"):  # a frozen part keeps no gradients and saves nothing for a backward
            getattr(taehv, part).requires_grad_(getattr(config, f"train_{part}"))
        student = Student(taehv).tap_last_layer() if config.adaptive_adversarial else Student(taehv)
        video = torch.rand(shape)  # fp32, the targets' copy, as the loop holds it; the student casts its input
        latents = None
        if config.use_ref_vae:
            with torch.no_grad():
                latents = torch.randn_like(taehv.encode_video(video.to(dtype)).float())
        lpips = LPIPS() if needs_module(config, "lpips") else None
        seraena = (SeraenaState(taehv.latent_channels, config.seraena_learning_rate, 4, 0, 0, torch.device("cpu"),
                                torch.bfloat16 if config.mixed_precision == "bf16" else None)
                   if needs_module(config, "seraena") else None)
        if autocast:  # as accelerate runs DDP under mixed precision: the student's forward alone autocast, fp32 out
            student.forward = autocast_forward(student.forward, _training_dtype(config))
        modules = [m for m in (student, lpips, seraena and seraena.seraena) if m is not None]
        tracker = StepPeak()
        with tracker:
            for tensor in [*(p for m in modules for p in m.parameters()), video, *([latents] if latents is not None else [])]:
                tracker.count(tensor)
            weights = sum(p.untyped_storage().nbytes() for m in modules for p in m.parameters())
            losses = forward_losses(config, student, video, latents, lpips)
            total = add_seraena_term(config, seraena, losses, last_layer=student.last_layer)
            total.backward()
            del total, losses
        return weights, tracker.peak


def autocast_forward(forward, dtype: torch.dtype):
    """`forward` under autocast with its outputs cast to fp32 (accelerate's prepare_model under DDP)."""
    def forward_under_autocast(*args, **kwargs):
        with torch.autocast("cpu", dtype):
            outputs = forward(*args, **kwargs)
        return {name: output.float() for name, output in outputs.items()}

    return forward_under_autocast


def measure_reference_encode(config) -> int:
    """Peak bytes of the reference VAE's encode of one batch (its published architecture from
    diffusers, bf16, tiling as configured) beyond its weights, on fake tensors. It runs before the
    student's step and is freed before it, so a rank needs the larger of the two."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from models.reference_vae import ReferenceVAE, reference_architecture

    geometry = measured_geometry(config)
    default_dtype = torch.get_default_dtype()
    with FakeTensorMode():
        torch.set_default_dtype(torch.bfloat16)  # as the step: built in its dtype
        try:
            vae = reference_architecture(config.reference_family, geometry, config.ref_vae_path)
        finally:
            torch.set_default_dtype(default_dtype)
        if (config.ref_vae_tiling or (geometry and geometry.needs_tiling)) and hasattr(vae, "enable_tiling"):
            vae.enable_tiling()
        reference = ReferenceVAE(vae, config.reference_family, sample_latents=config.ref_vae_sample_latents, geometry=geometry)
        video = torch.rand(config.batch_size_per_gpu, config.n_frames, 3, config.height, config.width)
        tracker = StepPeak()
        with tracker, torch.no_grad():
            for tensor in (*vae.parameters(), video):
                tracker.count(tensor)
            weights = sum(p.untyped_storage().nbytes() for p in vae.parameters())
            reference.encode(video)
        return tracker.peak - weights


# what the measured step and reference encode depend on (models/measure_cache.py keeps them by these
# keys' values): the keys declared with option(..., measured=("memory", ...)) in training/config/schema.py
MEASURED_KEYS = measured_keys("memory")


MEASURING_CODE = ("training/plan/memory.py", "training/step/losses.py", "training/config/terms.py", "training/step/seraena.py",
                  "models/taehv/blocks.py", "models/taehv/runners.py", "models/taehv/model.py",
                  "models/variants.py", "models/seraena.py", "models/metrics.py", "models/reference_vae.py",
                  "models/reference_families.py", "models/vae_geometry.py")


def estimate_memory(config) -> MemoryEstimate:
    from models.taehv import TAEHV

    config = at_largest_bucket(config)  # aspect buckets: the step, the batches in flight, the replay buffer at the largest
    model = TAEHV(student_of(config))
    params = sum(p.numel() for p in model.parameters())
    processes, zero = max(1, config.num_processes), config.zero_stage
    low_precision = config.mixed_precision in ("bf16", "fp16")
    weight_bytes = 2 if low_precision and zero > 0 else 4
    estimate = MemoryEstimate()
    gpu = estimate.gpu
    measured_weights, peak = cached_measurement("step_memory", measured_values(config, MEASURED_KEYS), MEASURING_CODE,
                                                lambda: measure_step(config))
    gpu["training step"] = (peak - measured_weights) / GB  # activations, the backward's working memory, gradients
    gpu["weights"] = params * weight_bytes / GB
    if zero == 0:
        gpu["gradients"] = params * 4 / GB  # DDP's bucket copy (the gradients themselves are in the step)
        gpu["optimizer"] = params * (8 + (4 if low_precision else 0)) / GB
    else:
        gpu["gradients"] = params * 4 / processes / GB  # accumulated in fp32 (training/loop/build.py deepspeed_data_types)
        gpu["deepspeed buckets"] = deepspeed_bucket_bytes(config, params) / GB
        gpu["optimizer"] = params * (4 + 8) / processes / GB
        if zero == 3:
            gpu["weights"] /= processes
    ema_share = processes if zero in (1, 2) else 1  # ZeRO-1/2: each rank averages its own partition
    gpu["EMA"] = params * 4 / ema_share / GB if config.ema_decay > 0 else 0.0
    gpu["LPIPS"] = LPIPS_PARAMS * 4 / GB if needs_module(config, "lpips") else 0.0
    if config.use_ref_vae and not config.latent_cache:
        family = FAMILY.get(config.reference_family)
        gpu["reference VAE weights"] = (family.parameter_count if family else MEASURED_VAE_PARAMS) * 2 / GB
        try:
            estimate.reference_encode_gb = cached_measurement("reference_encode_memory", measured_values(config, MEASURED_KEYS),
                                                              MEASURING_CODE, lambda: measure_reference_encode(config)) / GB
        except Exception as error:  # an architecture fake tensors cannot trace: said, not fatal to a dry run
            estimate.note = f"the reference VAE's encode was not measured ({type(error).__name__}: {str(error)[:120]})"
        # the encode's working memory is gone before the step starts: only what exceeds the step counts
        gpu["reference encode beyond the step"] = max(0.0, estimate.reference_encode_gb - gpu["training step"])
    gpu["cuDNN workspace"] = CUDNN_WORKSPACE_GB
    gpu["CUDA context"] = CUDA_CONTEXT_GB

    # what the buffer's slab allocates, and pins on CUDA, at its first entry (not rounded up: registered in place)
    buffer = replay_buffer_bytes(config, model.patch_size, model.latent_channels) if needs_module(config, "seraena") else 0
    staging = replay_staging_bytes(config, model.patch_size, model.latent_channels) if needs_module(config, "seraena") else 0
    clip_bytes = config.n_frames * 3 * config.height * config.width
    estimate.host = {
        "replay buffer": buffer / GB,
        "replay staging": staging / GB,  # a step's fakes on their way in (pinned like the slab)
        "data in flight": max(1, config.num_workers) * config.prefetch_factor * config.batch_size_per_gpu * clip_bytes * 2 / GB,
        "process": HOST_BASELINE_GB,
    }
    estimate.checkpoint = checkpoint_cost(config, model)
    estimate.checkpoint_replay_gb = estimate.checkpoint.replay_bytes / GB
    estimate.checkpoint_gb = estimate.checkpoint.total_bytes / GB
    estimate.checkpoints_kept = config.checkpoints_total_limit
    return estimate


# what the checkpoint time below assumes (not measured here): NCCL's all-reduce bus bandwidth across nodes
# (8 x 400 Gb/s InfiniBand per 8-GPU node), one small collective's latency at 64 ranks, shared storage's write rate
ALLREDUCE_BUS_GB_S = 40.0
COLLECTIVE_LATENCY_S = 1e-4
STORAGE_WRITE_GB_S = 1.0


@dataclass
class CheckpointCost:
    """One checkpoint folder (training/loop/checkpoints.py save_every_part), by what writes it."""

    rank0_bytes: int  # full_state.pt (fp32 weights + AdamW's two moments of the trained parameters), EMA, Seraena
    replay_bytes: int  # every rank's replay-buffer entries, each written by its rank (0 when left out)
    collectives: int  # blocking all-reduces that gather the full state (ZeRO: one per trained tensor and state)
    allreduce_bytes_per_rank: int  # what each rank sends and receives in them (a ring moves twice the payload)
    processes: int

    @property
    def total_bytes(self) -> int:
        return self.rank0_bytes + self.replay_bytes

    def seconds(self) -> float:
        """The blocking part of a checkpoint on the figures above: the gathers, then rank 0's write
        (the other ranks write their own replay buffers at the same time)."""
        gather = self.collectives * COLLECTIVE_LATENCY_S + self.allreduce_bytes_per_rank / GB / ALLREDUCE_BUS_GB_S
        writes = max(self.rank0_bytes, self.replay_bytes / self.processes) / GB / STORAGE_WRITE_GB_S
        return gather + writes


def checkpoint_cost(config, model=None) -> CheckpointCost:
    """What the run's largest checkpoint (its last) writes and gathers; each tensor once
    (training/run/elastic.py)."""
    from models.seraena import SeraenaDiscriminator
    from models.taehv import TAEHV

    model = model if model is not None else TAEHV(student_of(config))
    parts = [model.encoder] * config.train_encoder + [model.decoder] * config.train_decoder
    trained = [p for part in parts for p in part.parameters()]
    trained_numel = sum(p.numel() for p in trained)
    rank0 = trained_numel * 12  # fp32 master weight, exp_avg, exp_avg_sq
    rank0 += sum(p.numel() for p in model.parameters()) * 4 if config.ema_decay > 0 else 0  # the EMA's fp32 shadow
    seraena = needs_module(config, "seraena")
    if seraena:  # discriminator weights and BatchNorm statistics, AdamW's moments
        disc = SeraenaDiscriminator(9, model.latent_channels)
        rank0 += sum(t.numel() * t.element_size() for t in disc.state_dict().values()) + sum(p.numel() for p in disc.parameters()) * 8
    processes = max(1, config.num_processes)
    replay = replay_checkpoint_bytes(config, model) * processes if seraena and config.seraena_buffer_in_checkpoints else 0
    zero = config.zero_stage > 0 and processes > 1
    return CheckpointCost(rank0, replay, collectives=3 * len(trained) if zero else 0,
                          allreduce_bytes_per_rank=2 * trained_numel * 12 if zero else 0, processes=processes)


def replay_checkpoint_bytes(config, model) -> int:
    """One rank's replay buffer in the run's last checkpoint: the entries it holds by then (a
    checkpoint writes its filled slots, not its capacity: models/seraena.py ReplayBuffer.state_dict).
    Each discriminator update adds a step's frame groups (replay staging); it updates once per
    optimizer step from its start (training/config/terms.py). Every slot is the largest entry's size."""
    config = at_largest_bucket(config)
    per_update = replay_staging_bytes(config, model.patch_size, model.latent_channels)
    entry = replay_pair_bytes(config, model.patch_size, model.latent_channels)
    updates = max(0, config.max_steps - max(0, discriminator_start(config) - config.schedule_offset))
    return min(replay_capacity(config, model.patch_size, model.latent_channels), updates * (per_update // entry)) * entry


def deepspeed_bucket_bytes(config, params: int) -> int:
    """Bytes of the gradient buckets DeepSpeed's ZeRO optimizer allocates with the zero_optimization
    settings training/loop/build.py gives it (deepspeed 0.19, contiguous_gradients on, no offload):
    - ZeRO-1/2 (stage_1_and_2.py, setup_buckets, at the first gradient of each backward, freed
      after it): per communication dtype, one `torch.empty(reduce_bucket_size,
      dtype=self._gradient_reduction_buffer_dtype())`, a second one when overlap_comm is on. The
      dtype is the engine's (bf16) under ZeRO-2 and the fp32 accumulation dtype under ZeRO-1 with
      grad_accum_dtype fp32; communication_data_type fp32 changes the collective, not the bucket.
    - ZeRO-3 (stage3.py, at init, for the whole run): one `torch.empty(reduce_bucket_size,
      dtype=<communication dtype>)`, fp32 here.
    allgather_bucket_size allocates nothing (the gather writes into the flat weights)."""
    from training.step.optimizer import deepspeed_data_types, deepspeed_zero_settings

    zero = config.zero_stage
    if zero == 0:
        return 0
    settings = deepspeed_zero_settings(config, params)
    engine_bytes = 2 if config.mixed_precision in ("bf16", "fp16") else 4
    if zero == 3:
        communication = deepspeed_data_types(config).get("communication_data_type")
        return settings["reduce_bucket_size"] * (4 if communication == "fp32" else engine_bytes)
    fp32_accumulation = deepspeed_data_types(config).get("data_types", {}).get("grad_accum_dtype") == "fp32"
    bucket_bytes = 4 if zero == 1 and fp32_accumulation else engine_bytes
    return (2 if settings["overlap_comm"] else 1) * settings["reduce_bucket_size"] * bucket_bytes


def budget_problem(config, estimate: MemoryEstimate) -> str:
    """'' when the estimate fits gpu_memory_gb, else one line with the fixes and what they give."""
    budget = config.gpu_memory_gb
    if estimate.gpu_gb <= budget:
        return ""
    rest = estimate.gpu_gb - estimate.gpu["training step"]
    per_clip = estimate.gpu["training step"] / config.batch_size_per_gpu  # the step grows with the clips per micro-step
    fixes = []
    if not config.gradient_checkpointing:
        checkpointed = estimate_memory(replace(config, gradient_checkpointing=True))
        fixes.append(f"gradient_checkpointing=true (about {checkpointed.gpu_gb:.0f} GB)")
    batch = int((HEADROOM * budget - rest) // per_clip) if per_clip > 0 else 0
    if 1 <= batch < config.batch_size_per_gpu:
        fixes.append(f"batch_size_per_gpu={batch} (about {rest + batch * per_clip:.0f} GB; raise gradient_accumulation_steps "
                     "to keep the global batch)")
    fixes.append("fewer n_frames or smaller " + ("buckets (memory is planned for the largest)" if config.buckets else "height/width"))
    return (f"estimated GPU memory per rank {estimate.gpu_gb:.1f} GB exceeds gpu_memory_gb={budget:g} "
            f"(training step {estimate.gpu['training step']:.1f} GB): set " + ", or ".join(fixes))
