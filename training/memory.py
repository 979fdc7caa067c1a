"""Memory you can see before you launch: GPU and host memory per rank, and checkpoint size, of a
resolved config, estimated from one small forward measured here and scaled to the profile.

Activations: autograd's saved tensors of one training forward of the student with the
config's loss terms (precision and gradient checkpointing as configured), counted with
`torch.autograd.graph.saved_tensors_hooks` at a probe shape (batch 1, the config's frames,
PROBE_SIDE x PROBE_SIDE pixels) and scaled by pixel-frames: convolution activations grow
linearly with them (tested against a direct count at two larger shapes). The rest is
arithmetic on the parameter count and the accelerate file's engine:

| part | bytes |
|---|---|
| weights | params x 2 (bf16) or 4 |
| gradients | DDP: params x 4 plus its bucket copy; ZeRO-2/3: params x 2 / processes plus DeepSpeed's reduce and all-gather buckets (5e8 elements each, bf16) |
| optimizer | fp32 master (bf16 engines) and AdamW's two moments: params x (4 + 8), / processes under ZeRO |
| EMA | params x 4 on every rank |
| LPIPS | AlexNet + heads in fp32 when perceptual_weight > 0 |
| reference VAE | its weights in bf16 when it runs on the fly (its encode's working memory is not estimated: a latent cache removes it) |
| CUDA context and allocator slack | 1.5 GB |

Host per rank: the Seraena replay buffer (uint8 frame groups, bf16 contexts; its capacity is
capped by seraena_buffer_gb), the batches the data workers hold, and a process baseline.
Checkpoint: weights, optimizer state, EMA, and every rank's replay buffer (one file per rank). Not counted anywhere: the backward pass's transient working memory beyond the
saved tensors, and memory fragmentation: an estimate above 90% of the device is worth a look,
and the fixes suggested for a profile over budget aim at 90%.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field, replace

import torch

PROBE_SIDE = 64  # large enough for LPIPS's AlexNet (stride 4, three poolings) to scale linearly
GB = 1e9
CUDA_CONTEXT_GB = 1.5
HOST_BASELINE_GB = 3.0  # python, torch, CUDA libraries, the model copies of one rank process
DEEPSPEED_BUCKET_ELEMENTS = 5e8
REFERENCE_VAE_PARAMS = {"cogvideox": 215.6e6, "hunyuan": 246.5e6, "wan": 126.9e6,  # Wan 2.2's layout: 704.7e6
                        "hunyuan1_5": 1260.6e6, "ltx": 419.2e6, "ltx2": 1222.5e6, "minimax_h3": 2603.9e6}
LPIPS_PARAMS = 2.47e6 + 0.0015e6  # AlexNet features + linear heads
HEADROOM = 0.9  # suggested fixes aim at 90% of gpu_memory_gb: the backward's working memory is not counted


@dataclass
class MemoryEstimate:
    gpu: dict = field(default_factory=dict)  # part -> GB per rank
    host: dict = field(default_factory=dict)
    checkpoint_gb: float = 0.0
    activation_bytes_per_pixel_frame: float = 0.0

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
            budget += " (above 90%: the backward's working memory is not in the estimate; gradient_checkpointing=true lowers it)"
        return [f"GPU per rank:  {self.gpu_gb:.1f} GB{budget}: {parts(self.gpu)}",
                f"host per rank: {self.host_gb:.1f} GB: {parts(self.host)}",
                f"checkpoint:    {self.checkpoint_gb:.2f} GB per checkpoint folder"]


def _training_dtype(config) -> torch.dtype:
    return torch.bfloat16 if config.mixed_precision == "bf16" else torch.float16 if config.mixed_precision == "fp16" else torch.float32


def saved_activation_bytes(config, batch: int, n_frames: int, height: int, width: int, exact: bool = False) -> int:
    """Bytes autograd keeps for the backward of one training forward at this shape (each storage
    counted once), with the config's model, loss terms, precision and gradient checkpointing.

    bf16 convolutions on a CPU without bf16 units run ~20x slower than fp32, so by default the
    forward runs in fp32 and the tensors saved inside the student's forward (the ones a bf16
    engine holds in bf16) are counted at the training dtype's size; losses, LPIPS and Seraena
    stay fp32 either way. `exact=True` runs in the training dtype (tests/test_memory.py checks
    the two agree)."""
    from models.metrics import LPIPS
    from models.taehv import TAEHV
    from training.distill import SeraenaState, Student, add_seraena_term, forward_losses

    training_dtype = _training_dtype(config)
    dtype = training_dtype if exact else torch.float32
    student_scale = training_dtype.itemsize / dtype.itemsize
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        taehv = TAEHV(config.model_variant).set_gradient_checkpointing(config.gradient_checkpointing).train()
        for part in ("encoder", "decoder"):  # a frozen part saves nothing for a backward
            getattr(taehv, part).requires_grad_(getattr(config, f"train_{part}"))
        student = Student(taehv).to(dtype)
        video = torch.rand(batch, n_frames, 3, height, width)
        latents = None
        if config.use_ref_vae:
            with torch.no_grad():
                latents = torch.randn_like(taehv.encode_video(video.to(dtype)).float())
        lpips = LPIPS() if config.perceptual_weight > 0 else None
        seraena = (SeraenaState(taehv.latent_channels, 3e-4, 4, 0, 0, torch.device("cpu"), None)
                   if config.seraena_weight > 0 else None)
        modules = [m for m in (student, lpips, seraena and seraena.seraena) if m is not None]
        weights = {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}
        packed: list[tuple[weakref.ref, float]] = []
        inside_student = [False]  # what the student's forward saves, a bf16 engine saves in bf16

        def enter(module, args, kwargs):
            inside_student[0] = True

        def leave(module, args, kwargs, output):
            inside_student[0] = False

        hooks = [student.register_forward_pre_hook(enter, with_kwargs=True),
                 student.register_forward_hook(leave, with_kwargs=True)]

        def pack(tensor: torch.Tensor):
            scale = student_scale if inside_student[0] and tensor.dtype == dtype else 1.0
            packed.append((weakref.ref(tensor), scale))
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            losses = forward_losses(config, student, video.to(dtype), latents, lpips)
            total = add_seraena_term(config, seraena, losses)
        for hook in hooks:
            hook.remove()
        # what the student's graph still holds when its backward starts: graphs that were already
        # run and freed (Seraena's discriminator step) no longer count
        alive = {}
        for ref, scale in packed:
            tensor = ref()
            if tensor is not None and tensor.untyped_storage().data_ptr() not in weights:  # parameters count as weights
                alive[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes() * scale
        del total, losses
    return int(sum(alive.values()))


def estimate_memory(config) -> MemoryEstimate:
    from models.taehv import TAEHV

    model = TAEHV(config.model_variant)
    params = sum(p.numel() for p in model.parameters())
    processes, zero = max(1, config.num_processes), config.zero_stage
    pixel_frames = config.n_frames * config.height * config.width
    per_pixel_frame = saved_activation_bytes(config, 1, config.n_frames, PROBE_SIDE, PROBE_SIDE) / (
        config.n_frames * PROBE_SIDE * PROBE_SIDE)
    low_precision = config.mixed_precision in ("bf16", "fp16")
    weight_bytes = 2 if low_precision else 4
    estimate = MemoryEstimate(activation_bytes_per_pixel_frame=per_pixel_frame)
    gpu = estimate.gpu
    gpu["activations"] = per_pixel_frame * config.batch_size_per_gpu * pixel_frames / GB
    gpu["weights"] = params * weight_bytes / GB
    if zero == 0:
        gpu["gradients"] = 2 * params * 4 / GB  # the gradients and DDP's bucket copy of them
        gpu["optimizer"] = params * (8 + (4 if low_precision else 0)) / GB
    else:
        gpu["gradients"] = params * 2 / processes / GB
        gpu["deepspeed buckets"] = 2 * DEEPSPEED_BUCKET_ELEMENTS * 2 / GB
        gpu["optimizer"] = params * (4 + 8) / processes / GB
        if zero == 3:
            gpu["weights"] /= processes
    gpu["EMA"] = params * 4 / GB if config.ema_decay > 0 else 0.0
    gpu["LPIPS"] = LPIPS_PARAMS * 4 / GB if config.perceptual_weight > 0 else 0.0
    if config.use_ref_vae and not config.latent_cache:
        gpu["reference VAE weights"] = REFERENCE_VAE_PARAMS.get(config.ref_vae_family, 250e6) * 2 / GB
    gpu["CUDA context"] = CUDA_CONTEXT_GB

    pair_bytes = replay_pair_bytes(config, model.patch_size, model.latent_channels)
    buffer = replay_capacity(config, model.patch_size, model.latent_channels) * pair_bytes if config.seraena_weight > 0 else 0
    clip_bytes = config.n_frames * 3 * config.height * config.width
    estimate.host = {
        "replay buffer": buffer / GB,
        "data in flight": max(1, config.num_workers) * config.prefetch_factor * config.batch_size_per_gpu * clip_bytes * 2 / GB,
        "process": HOST_BASELINE_GB,
    }
    estimate.checkpoint_gb = (params * (weight_bytes + 4 + 8 + 4 + 4) + buffer * processes) / GB  # a buffer per rank
    return estimate


def replay_pair_bytes(config, patch_size: int, latent_channels: int) -> int:
    """Host bytes of one replay-buffer entry: a group of 3 RGB frames (uint8) and its bf16 context."""
    latent_side = 8 * patch_size
    context = 2 * latent_channels * math.ceil(config.height / latent_side) * math.ceil(config.width / latent_side)
    return 9 * config.height * config.width + context


def replay_capacity(config, patch_size: int, latent_channels: int) -> int:
    """seraena_buffer_size, capped so the buffer stays within seraena_buffer_gb of host memory per rank."""
    fitting = int(config.seraena_buffer_gb * GB // replay_pair_bytes(config, patch_size, latent_channels))
    return max(1, min(config.seraena_buffer_size, fitting))


def budget_problem(config, estimate: MemoryEstimate) -> str:
    """'' when the estimate fits gpu_memory_gb, else one line with the fixes and what they give."""
    budget = config.gpu_memory_gb
    if estimate.gpu_gb <= budget:
        return ""
    rest = estimate.gpu_gb - estimate.gpu["activations"]
    per_clip = estimate.gpu["activations"] / config.batch_size_per_gpu
    fixes = []
    if not config.gradient_checkpointing:
        checkpointed = estimate_memory(replace(config, gradient_checkpointing=True))
        fixes.append(f"gradient_checkpointing=true (about {checkpointed.gpu_gb:.0f} GB)")
    batch = int((HEADROOM * budget - rest) // per_clip) if per_clip > 0 else 0
    if 1 <= batch < config.batch_size_per_gpu:
        fixes.append(f"batch_size_per_gpu={batch} (about {rest + batch * per_clip:.0f} GB; raise gradient_accumulation_steps "
                     "to keep the global batch)")
    fixes.append("fewer n_frames or smaller height/width")
    return (f"estimated GPU memory per rank {estimate.gpu_gb:.1f} GB exceeds gpu_memory_gb={budget:g} "
            f"(activations {estimate.gpu['activations']:.1f} GB): set " + ", or ".join(fixes))
