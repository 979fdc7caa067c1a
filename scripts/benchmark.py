"""Where a training step's time goes, and what our loop costs over a bare PyTorch loop.

    python -m scripts.benchmark --json benchmark.json --plot benchmark.png [--steps 20] \
        [--height 32 --width 32 --frames 8 --batch 8] [--ref-vae cogvideox] [--compile] [--skip-launches]

1. Phases, in one process with the real parts (student, a reference VAE of the real diffusers
   class built from a small config with random weights, Seraena, AdamW): reference VAE, student
   forward, Seraena, backward, optimizer. Medians over --steps after --warmup warm-up steps (3).
2. Student FLOPs per step (training/step_flops.count_flops, forward + backward) and achieved FLOP/s
   of this fp32 toy-shape step; on a CPU also `mfu_vs_measured_peak`, against this CPU's fastest
   fp32 kernel (measured_peak_flops); a GPU's MFU comes from --profile (training dtype and shape).
3. Variants of the bare step: channels_last, bf16 autocast, and torch.compile with --compile.
3b. A distillation step with latents in memory, from a real latent cache (written here by
   scripts/cache_latents.py over the sample clips) and from the reference VAE on the fly:
   `cache_vs_student_only` = cached step / in-memory step.
4. Our loop (train_taehv_h100.sh, autoencoder mode, same model, crop and batch, one process)
   against the bare loop doing the same math in one process: `overhead_vs_bare` =
   our step time / bare step time. Our step time comes from the run's TensorBoard
   `train/samples_per_second` (first log interval dropped), and includes data loading, EMA and
   logging. Then DDP vs ZeRO-2 vs ZeRO-3 on 2 processes (samples/s), all fp32.
Every number is printed as JSON with the device and the command line; no targets are asserted.

With --profile NAME (h100, 1gpu_h100, a800, cpu, ...): the training micro-step of that profile,
at its shape, precision and loss terms, instead of the sections above:

    python -m scripts.benchmark --profile h100 --dry-run     # FLOPs and bytes of the whole step, nothing run
    python -m scripts.benchmark --profile h100 --json h100.json   # on a GPU: timed, clips/s, MFU

FLOPs and bytes moved per part (training/plan/step_flops.py: student, LPIPS, Seraena, reference VAE,
optimizer) and of the student alone, with each part's roofline floor, max(FLOPs / peak, bytes /
bandwidth), on this GPU's spec figures or an H100 SXM's (training/plan/roofline.py DEVICE_SPECS),
printed on stderr beside the measured step (`predicted_floor_s`, `step_over_floor`); the timed
step runs the loop's own forward_losses/add_seraena_term, backward and AdamW in the training
dtype, with the reference VAE's published architecture (random weights) in bf16 on the fly, or
without it (`--latents cached`, as with a latent cache). MFU is given against
the device's spec dense bf16 peak (DEVICE_SPECS) and against the measured peak (the faster of a
large matmul and a large convolution in the step's dtype, measured before and after the step), each
labelled; the headline is clips/s per GPU. Strategy comparisons (DDP vs ZeRO) need 2+ GPUs and
are skipped with that reason otherwise.

    python -m scripts.benchmark --profile h100 --kernels --json h100.json   # where the time goes

With --kernels, each part the step marks (reference encode, student forward, losses, LPIPS,
Seraena, backward, optimizer) is timed in the same runs, by CUDA events on a GPU, perf_counter on a
CPU (`parts_s`), and one more run under torch.profiler gives the top kernels by CUDA time, or aten
ops by self CPU time on a CPU (`top_kernels`); a markdown table of both, each part beside its
roofline floor, goes to stderr and beside the JSON (h100.json -> h100.md). scripts/step_parts.py.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from models.cpu_bf16 import bf16_convolutions, convolutions_in_fp32  # noqa: E402
from models.reference_families import FAMILIES  # noqa: E402
from models.taehv import TAEHV  # noqa: E402
from scripts.results import emit_result  # noqa: E402
from scripts.step_parts import StepParts, TimedParts, parts_markdown, top_kernels  # noqa: E402
from training.base.fast_exit import exit_now  # noqa: E402


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(device: torch.device, fn, repeats: int) -> float:
    fn()  # warm-up: first-call setup, thread pool, cuDNN's algorithm choice
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def measured_peak_flops(device: torch.device, dtypes: tuple = (), repeats: int = 7) -> tuple[float, str]:
    """(FLOP/s, the kernel that gave it): the fastest of the two kinds of dense work a step is made
    of, in each dtype the step runs in (default bf16 on GPU, fp32 on CPU), each counted as the step is counted
    (training/step_flops.count_flops: a convolution without its padding) and timed as the best of
    `repeats` after a warm-up: a large matmul (cuBLAS; MKL on CPU) and a large 3x3 convolution at
    the student's width (cuDNN; oneDNN on CPU, whose AVX-512 kernels ran 15-30% above MKL's fp32
    matmul on the 2-core AMD EPYC the CPU numbers come from). Call it before and after the timed
    step and keep the larger: one sample on a shared machine can fall in someone else's burst."""
    from training.plan.step_flops import count_flops

    cuda = device.type == "cuda"
    rates = {}
    for dtype in dtypes or ((torch.bfloat16,) if cuda else (torch.float32,)):
        name = str(dtype).removeprefix("torch.")
        # a CPU without bf16 units runs bf16 about 30x slower than fp32: 1/16 of the work keeps each
        # kernel near a second there (the full sizes took minutes)
        small = not cuda and dtype != torch.float32
        n = 8192 if cuda else 512 if small else 2048
        # (batch, channels, side): the student's widths (64 runs slower than 128 and 256 on oneDNN), ~5 GFLOP each on CPU
        convolutions = ((64, 256, 128), (64, 512, 64)) if cuda else ((1, 128, 32), (1, 256, 16)) if small else ((16, 128, 32), (16, 256, 16))
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        rates[f"{name} matmul {n}x{n}x{n}"] = 2 * n**3 / best_seconds(device, lambda: a @ b, repeats)
        del a, b
        for batch, channels, side in convolutions:
            x = torch.randn(batch, channels, side, side, device=device, dtype=dtype)
            w = torch.randn(channels, channels, 3, 3, device=device, dtype=dtype)
            if cuda:  # the tensor-core layout the GPU profiles train in (channels_last)
                x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
            flops = count_flops(lambda: F.conv2d(x, w, padding=1))
            rates[f"{name} 3x3 convolution, {channels} channels, {batch}x{side}x{side}"] = (
                flops / best_seconds(device, lambda: F.conv2d(x, w, padding=1), repeats))
            del x, w
    label = max(rates, key=rates.get)
    return rates[label], f"{label}: {rates[label] / 1e9:.0f} GFLOP/s"


class PhaseTimer:
    def __init__(self, device: torch.device):
        self.device, self.times = device, {}

    def __call__(self, name: str, fn, *args):
        synchronize(self.device)
        start = time.perf_counter()
        result = fn(*args)
        synchronize(self.device)
        self.times.setdefault(name, []).append(time.perf_counter() - start)
        return result

    def medians(self, warmup: int) -> dict:
        return {name: statistics.median(values[warmup:]) for name, values in self.times.items()}


def reference_vae_module(args):
    """The diffusers class of --ref-vae with random weights: a small config, or with --ref-vae-size
    full the class's default config, which is the published architecture (CogVideoX-2b's VAE:
    215.6 M parameters)."""
    from models.reference_vae import tiny_reference_vae_config, vae_class

    torch.manual_seed(0)
    config = {} if args.ref_vae_size == "full" else tiny_reference_vae_config(args.ref_vae)
    return vae_class(args.ref_vae)(**config)


def phase_times(args, device: torch.device) -> dict:
    from models.reference_vae import ReferenceVAE
    from training.step.losses import aligned
    from training.step.seraena import SeraenaState

    torch.manual_seed(0)
    student = TAEHV(args.variant).to(device).train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4, fused=device.type == "cuda")
    reference = None
    if args.ref_vae != "none":
        vae = reference_vae_module(args)
        reference = ReferenceVAE(vae.to(device), args.ref_vae, sample_latents=True)
    seraena = SeraenaState(student.latent_channels, 3e-4, 64, seed=0, rank=0, device=device, amp_dtype=None)
    video = torch.rand(args.batch, args.frames, 3, args.height, args.width, device=device)
    reference_video = None
    if reference is not None:  # the reference needs its own frame rule; the nearest valid count at or above
        from models.reference_families import valid_frame_counts

        frames = min(n for n in valid_frame_counts(args.ref_vae, 200) if n >= args.frames)
        reference_video = torch.rand(args.batch, frames, 3, args.height, args.width, device=device)
    with torch.no_grad():  # Seraena's context (the clip's latents), computed once so it is not timed
        context = student.encode_video(video)
    timer = PhaseTimer(device)
    for _ in range(args.steps + args.warmup):
        if reference is not None:
            timer("reference_vae", reference.encode, reference_video)
        decoded = timer("student_forward", lambda: student(video))
        timer("seraena", lambda: seraena.loss(video, decoded.detach(), context))
        loss = F.mse_loss(decoded, aligned(video, decoded))
        timer("backward", loss.backward)
        timer("optimizer", lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))
    phases = timer.medians(args.warmup)
    phases["bare_step"] = phases["student_forward"] + phases["backward"] + phases["optimizer"]
    return phases, (reference_video.shape[1] if reference_video is not None else None)


def student_flops(args, device: torch.device) -> float:
    """Forward and backward of the timed student, counted as training/plan/step_flops.py counts."""
    from training.plan.step_flops import count_flops

    student = TAEHV(args.variant).to(device).train()
    video = torch.rand(args.batch, args.frames, 3, args.height, args.width, device=device)

    def step():
        decoded = student(video)
        F.mse_loss(decoded, video[:, : decoded.shape[1]]).backward()

    return count_flops(step)


def bare_step_variants(args, device: torch.device) -> dict:
    """Median forward+backward+optimizer time of the bare step under each setting."""
    results = {}
    settings = ["fp32", "channels_last", "bf16_autocast"] + (["compile"] if args.compile else [])
    for setting in settings:
        torch.manual_seed(0)
        student = TAEHV(args.variant).to(device).train()
        video = torch.rand(args.batch, args.frames, 3, args.height, args.width, device=device)
        if setting == "channels_last":
            student = student.to(memory_format=torch.channels_last)
        forward = torch.compile(student) if setting == "compile" else student
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4)
        times = []
        for _ in range(args.steps + args.warmup):
            synchronize(device)
            start = time.perf_counter()
            # bf16 convolutions as the trainer runs them (fp32-accumulated on a CPU without bf16 units)
            bf16 = setting == "bf16_autocast"
            with bf16_convolutions(device, torch.bfloat16 if bf16 else torch.float32):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    decoded = forward(video)
                F.mse_loss(decoded.float(), video[:, : decoded.shape[1]]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize(device)
            times.append(time.perf_counter() - start)
        results[setting] = statistics.median(times[args.warmup:])
    return results


def distillation_step_times(args, device: torch.device, data_root: Path) -> dict:
    """A distillation step (encoder, decoder and reconstruction terms) timed three ways, interleaved:
    latents already in memory (the student alone), latents read from a real cache written by
    scripts/cache_latents.py (read, bf16 -> fp32, sampled, moved to the device; not overlapped
    with the step as loader workers would do), and latents from the reference VAE on the fly."""
    import dataclasses
    import random

    from models.reference_families import valid_frame_counts
    from models.reference_vae import ReferenceVAE
    from training.config.schema import TrainConfig
    from training.config.terms import WEIGHT_KEYS
    from training.data.latent_cache import CachedClipDataset
    from training.step.losses import Student, compute_losses

    frames = min(n for n in valid_frame_counts(args.ref_vae, 200) if n >= args.frames)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        torch.manual_seed(0)
        vae = reference_vae_module(args)
        vae.save_pretrained(str(folder / "vae"))
        command = [sys.executable, "-m", "scripts.cache_latents", "cpu", "--out", str(folder / "cache"), "--shard-size", "64"]
        for item in (f"data_root={data_root}", "use_ref_vae=true", f"ref_vae_family={args.ref_vae}", f"ref_vae_path={folder / 'vae'}",
                     f"height={args.height}", f"width={args.width}", f"n_frames={frames}", "encoder_weight=0.1",
                     "decoder_weight=0.1", f"batch_size_per_gpu={args.batch}", "num_workers=1", "half_size_every=0",
                     "student_start=random"):  # the cpu profile's block-average start is for autoencoder mode only
            command += ["--set", item]
        start = time.perf_counter()
        written = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
        write_s = time.perf_counter() - start
        if written.returncode != 0:
            print(written.stderr[-2000:], file=sys.stderr)
            return {"error": "scripts.cache_latents failed"}
        cached = CachedClipDataset(folder / "cache", "train", data_root, sample_latents=True, seed=0)
        reference = ReferenceVAE(vae.to(device), args.ref_vae, sample_latents=True)
        torch.manual_seed(0)
        student = Student(TAEHV(args.variant)).to(device).train()
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4)
        # encoder, decoder and reconstruction terms; every other term (training/config/terms.py) off
        weights = dataclasses.replace(TrainConfig(), **{**dict.fromkeys(WEIGHT_KEYS, 0.0), "encoder_weight": 0.1,
                                                        "decoder_weight": 0.1, "reconstruction_weight": 10.0}, pixel_loss="mse")
        video = torch.rand(args.batch, frames, 3, args.height, args.width, device=device)
        in_memory = reference.encode(video)
        rng = random.Random(0)

        def from_cache():
            rows = [cached.record(rng.randrange(len(cached))) for _ in range(args.batch)]
            return torch.stack([cached.latents(row, rng) for row in rows]).to(device)

        def step(get_latents):
            latents = get_latents()
            loss, _ = compute_losses(weights, student, video, latents, None)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        timer = PhaseTimer(device)
        for _ in range(args.steps + args.warmup):
            timer("student_only", step, lambda: in_memory)
            timer("from_cache", step, from_cache)
            timer("on_the_fly", step, lambda: reference.encode(video))
        times = timer.medians(args.warmup)
        return {"frames": frames, "step_s": times, "cache_write_s": write_s, "cached_samples": len(cached),
                "cache_vs_student_only": times["from_cache"] / times["student_only"],
                "on_the_fly_vs_student_only": times["on_the_fly"] / times["student_only"]}


def spec_peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The device's spec dense bf16 peak (training/plan/roofline.py DEVICE_SPECS) and its label."""
    from training.plan.roofline import spec_for

    if device.type != "cuda":
        return None, "no spec peak for a CPU"
    name = torch.cuda.get_device_name(device)
    spec = spec_for(name)
    if spec is None:
        return None, f"no spec peak known for {name}"
    return spec.peak_flops, f"{spec.name} spec dense bf16 ({spec.peak_flops / 1e12:.0f} TFLOP/s)"


def profile_config(args):
    from training.config.load import load_config

    return load_config(args.profile, list(args.set), check_paths=False)


def profile_step_time(config, device: torch.device, steps: int, cached_latents: bool, warmup: int = 3) -> float:
    """Median seconds of one training micro-step of `config` on this device (profile_step)."""
    step, window = profile_step(config, device, cached_latents)
    return timed_windows(step, device, steps, window, warmup)


def timed_windows(step, device: torch.device, steps: int, window: int, warmup: int = 3, parts=None) -> float:
    """Median seconds per micro-step of step() (a window of `window` micro-steps) over `steps` runs after
    `warmup` untimed runs; TimedParts `parts` collects each run's parts."""
    timer = PhaseTimer(device)
    for _ in range(steps + warmup):
        timer("step", step)
        if parts is not None:
            parts.collect()
    return timer.medians(warmup)["step"] / window


def profile_step(config, device: torch.device, cached_latents: bool, parts=None):
    """(step, micro-steps per step): one optimizer step of `config` on this device, as the trainer runs
    it: its CUDA settings (TF32, cuDNN autotuning), its student, LPIPS and Seraena builders (Seraena in
    bf16 autocast on a bf16 GPU run), the loop's own loss code, and its cadence: windows of
    gradient_accumulation_steps micro-steps, the last one updating Seraena's discriminator and
    stepping the optimizer. The module is in the training dtype as DeepSpeed holds it. The step marks
    its parts on `parts` (scripts/step_parts.py; by default marks that do nothing)."""
    from types import SimpleNamespace

    from models.metrics import LPIPS
    from models.reference_vae import ReferenceVAE, reference_architecture
    from training.config.views import measured_geometry
    from training.loop.build import build_model, build_seraena, configure_cuda
    from training.step.losses import add_seraena_term, forward_losses

    configure_cuda(config)
    dtype = torch.bfloat16 if config.mixed_precision == "bf16" else torch.float32
    config.pretrained_model_path = ""
    torch.manual_seed(0)
    student = build_model(config).to(device, dtype)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4, fused=device.type == "cuda")
    lpips = LPIPS().to(device).requires_grad_(False) if config.perceptual_weight > 0 else None
    seraena = build_seraena(config, SimpleNamespace(device=device, process_index=0), student.taehv)
    video = torch.rand(config.batch_size_per_gpu, config.n_frames, 3, config.height, config.width, device=device)
    reference, latents = None, None
    if config.use_ref_vae:
        geometry = measured_geometry(config)
        vae = reference_architecture(config.reference_family, geometry, config.ref_vae_path)
        vae = vae.to(device, dtype if device.type == "cuda" else torch.float32)
        reference = ReferenceVAE(vae.eval(), config.reference_family, sample_latents=True, geometry=geometry)
        with torch.no_grad():
            latents = reference.encode(video)
    window = config.gradient_accumulation_steps
    parts = parts or StepParts()
    parts.watch(student, "student_forward")  # inside forward_losses: the losses' time is theirs without it
    parts.watch(lpips, "lpips")

    convolutions = bf16_convolutions(device, dtype)  # fp32-accumulated on a CPU without bf16 units, as the trainer runs

    def step():
        with convolutions:
            micro_steps()

    def micro_steps():
        for micro_step in range(window):
            step_latents = latents
            if not cached_latents and reference is not None:
                with parts("reference_encode"):
                    step_latents = reference.encode(video)
            with parts("losses"):
                losses = forward_losses(config, student, video, step_latents, lpips)  # fp32 targets, as the loop
            with parts("seraena"):
                total = add_seraena_term(config, seraena, losses, update_discriminator=micro_step == window - 1,
                                         last_layer=student.last_layer)
            with parts("backward"):
                total.backward()
        with parts("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step, window


def profile_benchmark(args) -> dict:
    from training.plan.roofline import H100, floors, spec_for
    from training.plan.step_flops import step_costs

    config = profile_config(args)
    cached = args.latents == "cached"
    if cached:
        config.latent_cache = "(benchmark: latents in memory)"
    costs = step_costs(config)
    flops = {part: cost["flops"] for part, cost in costs.items()}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # the floors on this GPU when the table knows it, else on the H100 SXM the profiles are planned for
    floor_spec = (spec_for(torch.cuda.get_device_name(device)) if device.type == "cuda" else None) or H100
    floor = floors(costs, floor_spec)
    peak, peak_label = spec_peak_flops(device)
    batch = config.batch_size_per_gpu
    result = {
        "command": " ".join([sys.executable, "-m", "scripts.benchmark", *(args.argv)]),
        "profile": args.profile,
        "shape": {"batch_per_gpu": batch, "frames": config.n_frames, "height": config.height, "width": config.width,
                  "variant": config.model_variant, "precision": config.mixed_precision},
        "loss_terms": {k: getattr(config, f"{k}_weight") for k in ("reconstruction", "encoder", "decoder", "perceptual", "seraena",
                                                                         "temporal")},
        "reference_vae": ("none (autoencoder mode)" if not config.use_ref_vae else "none (latents cached)" if cached
                          else f"{config.reference_family} on the fly (published architecture, random weights)"),
        "flops_per_micro_step": flops,
        "student_flops_per_micro_step": flops["student"],
        "clips_per_s_per_gpu_at_989_tflops": batch / (flops["total"] / 989e12),
        "bytes_per_micro_step": {part: cost["bytes"] for part, cost in costs.items()},
        "student_bytes_per_micro_step": costs["student"]["bytes"],
        # max(FLOPs / peak, bytes / bandwidth) per part, the total the sum (training/plan/roofline.py)
        "predicted_floor_s": floor,
        "floor_device": floor_spec.label(),
        "clips_per_s_per_gpu_at_floor": batch / floor["total"],
    }
    if args.dry_run:
        result["device"] = "none (dry run: FLOPs and bytes counted on the meta device, nothing run)"
        return result
    # the step's dtypes: the student's, and on a CPU the reference VAE's fp32 (profile_step_time)
    # (the student's convolutions run in fp32 on a CPU without bf16 units: models/cpu_bf16.py)
    student_dtype = torch.bfloat16 if config.mixed_precision == "bf16" else torch.float32
    if convolutions_in_fp32(device, student_dtype):
        student_dtype = torch.float32
    dtypes = tuple({student_dtype, *([torch.float32] if device.type == "cpu" and config.use_ref_vae and not cached else [])})
    peak_before = measured_peak_flops(device, dtypes)
    parts = TimedParts(device) if args.kernels else None
    step, window = profile_step(config, device, cached, parts)
    step_s = timed_windows(step, device, args.steps, window, args.warmup, parts)
    if parts is not None:  # the parts of the same timed runs, then one more run under the profiler
        result.update(parts_s=parts.medians(args.warmup, window), parts_timer="CUDA events" if device.type == "cuda" else "perf_counter",
                      top_kernels=top_kernels(step, device, window),
                      kernel_timer="CUDA time (torch.profiler)" if device.type == "cuda" else "self CPU time (torch.profiler)")
    measured_peak, measured_label = max(peak_before, measured_peak_flops(device, dtypes))
    achieved = flops["total"] / step_s
    result.update({
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "step_s": step_s,
        "clips_per_s_per_gpu": batch / step_s,
        "achieved_flops_per_s": achieved,
        "mfu_vs_spec_peak": achieved / peak if peak else None,
        "spec_peak": peak_label,
        "mfu_vs_measured_peak": achieved / measured_peak,
        "measured_peak_flops_per_s": measured_peak,
        "measured_peak_kernel": measured_label,
        "step_over_floor": step_s / floor["total"],
        "strategies": (("skipped: " if torch.cuda.device_count() < 2 else "not run here: ")
                       + f"DDP vs ZeRO comparisons need 2+ GPUs ({torch.cuda.device_count()} visible); "
                       "run ./train_taehv_h100.sh 8 h100 --set accelerate_config=ddp_gpu_bf16.yaml and compare "
                       "train/samples_per_second"),
    })
    return result


def print_floors(result: dict) -> None:
    """Each part's roofline floor, and beside the whole step's the measured time where it ran (the
    measured parts, with --kernels, are in parts_markdown's table)."""
    from training.plan.roofline import PART_NAMES, shown

    print(f"roofline floors on {result['floor_device']}, per micro-step:", file=sys.stderr)
    for part, floor in result["predicted_floor_s"].items():
        measured = (f"   measured {shown(result['step_s'] * 1e3):>8} ms ({result['step_over_floor']:.1f}x the floor, "
                    f"{result['device']})" if part == "total" and "step_s" in result else "")
        print(f"  {PART_NAMES.get(part, part):<22}{shown(result['flops_per_micro_step'][part] / 1e12):>8} TFLOP "
              f"{shown(result['bytes_per_micro_step'][part] / 1e9):>8} GB   floor {shown(floor * 1e3):>8} ms{measured}",
              file=sys.stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loop_samples_per_second(args, processes: int, accelerate_file: str, data_root: Path, extra_sets: tuple = ()) -> float | None:
    """Run our launcher and read train/samples_per_second back from its TensorBoard file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with tempfile.TemporaryDirectory() as run_dir:
        env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
        steps = args.steps + 10
        command = [str(REPO_ROOT / "train_taehv_h100.sh"), str(processes), "cpu", "--output-dir", run_dir,
                   "--max-steps", str(steps)]
        for key, value in (("data_root", data_root), ("height", args.height), ("width", args.width),
                           ("n_frames", args.frames), ("batch_size_per_gpu", args.batch), ("model_variant", args.variant),
                           ("accelerate_config", accelerate_file), ("log_every", 5), ("validation_steps", steps),
                           ("checkpointing_steps", steps), ("warmup_steps", 1)):
            command += ["--set", f"{key}={value}"]
        for item in extra_sets:
            command += ["--set", item]
        result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if result.returncode != 0:
            print(result.stderr[-2000:], file=sys.stderr)
            return None
        events = EventAccumulator(str(Path(run_dir) / "logs" / "taehv"))
        events.Reload()
        values = [e.value for e in events.Scalars("train/samples_per_second")][1:-1]  # drop warm-up and the final interval
        return statistics.median(values) if values else None


def write_plot(path: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    phases = {k: v * 1000 for k, v in result["phases_s"].items() if k != "bare_step"}
    left.barh(list(phases), list(phases.values()))
    left.set_xlabel("ms per step (median)")
    left.set_title("step phases, one process")
    strategies = {k: v for k, v in result.get("strategies_samples_per_second", {}).items() if v}
    if strategies:
        right.bar(list(strategies), list(strategies.values()))
        right.set_ylabel("samples / s")
        right.set_title("2 processes")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="taehv")
    parser.add_argument("--height", type=int, default=32)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--frames", type=int, default=8)  # 5 decoded frames: one Seraena group
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (or windows) before the --steps timed ones")
    parser.add_argument("--ref-vae", default="cogvideox", choices=(*FAMILIES, "none"))
    parser.add_argument("--ref-vae-size", choices=("small", "full"), default="small",
                        help="small random config, or the published architecture (random weights)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile on CPU)")
    parser.add_argument("--skip-launches", action="store_true", help="in-process measurements only")
    parser.add_argument("--data-root", type=Path, default=REPO_ROOT / "data" / "synthetic")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--profile", help="benchmark this profile's training micro-step (shape, precision, loss terms)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="with --profile: config overrides")
    parser.add_argument("--latents", choices=("on-the-fly", "cached"), default="on-the-fly",
                        help="with --profile: reference VAE in the step, or latents as a latent cache gives them")
    parser.add_argument("--dry-run", action="store_true", help="with --profile: print the FLOPs, bytes and floors per part only")
    parser.add_argument("--kernels", action="store_true", help="with --profile: time each part of the step and list the top "
                        "kernels; a markdown table on stderr and beside --json F (F with .md)")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    if args.kernels and (args.dry_run or not args.profile):
        parser.error("--kernels times the step of a --profile: give --profile, without --dry-run")
    if args.profile:
        result = profile_benchmark(args)
        emit_result(result, args.json)
        print_floors(result)
        if args.kernels:
            table = parts_markdown(result)
            print(table, file=sys.stderr)
            if args.json:
                args.json.with_suffix(".md").write_text(table)
        return 0
    if args.dry_run:
        parser.error("--dry-run needs --profile")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    peak_before = measured_peak_flops(device, (torch.float32,))
    phases, reference_frames = phase_times(args, device)
    flops = student_flops(args, device)
    peak, peak_label = max(peak_before, measured_peak_flops(device, (torch.float32,)))
    achieved = flops / (phases["student_forward"] + phases["backward"])
    result = {
        "command": " ".join([sys.executable, "-m", "scripts.benchmark", *(argv if argv is not None else sys.argv[1:])]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "shape": {"batch": args.batch, "frames": args.frames, "height": args.height, "width": args.width, "variant": args.variant},
        "phases_s": phases,
        "reference_vae": {"family": args.ref_vae, "frames": reference_frames, "size": args.ref_vae_size,
                          "parameters": sum(p.numel() for p in reference_vae_module(args).parameters()) if args.ref_vae != "none" else 0,
                          "weights": "random (speed only), the real diffusers class"},
        "student_flops_per_step": flops,
        "achieved_flops_per_s": achieved,
        "measured_peak_flops_per_s": peak,
        "measured_peak_kernel": peak_label,
        # this mode times an fp32 student at a toy shape: no MFU against a GPU's bf16 peak (use --profile);
        # on a CPU, the fp32 step against the fastest fp32 kernel of this CPU (measured_peak_flops)
        "mfu": None,
        "mfu_vs_measured_peak": achieved / peak if device.type == "cpu" else None,
        "bare_step_variants_s": bare_step_variants(args, device),
    }
    if not args.data_root.is_dir():
        from training.data.synthetic_clips import make_sample_videos

        make_sample_videos(args.data_root)
    if args.ref_vae != "none":
        result["distillation"] = distillation_step_times(args, device, args.data_root)
        result["cache_vs_student_only"] = result["distillation"].get("cache_vs_student_only")
    if not args.skip_launches:
        ours = loop_samples_per_second(args, 1, "ddp_cpu.yaml", args.data_root)  # the cpu profile's default
        result["our_loop_step_s"] = args.batch / ours if ours else None
        result["overhead_vs_bare"] = (args.batch / ours) / phases["bare_step"] if ours else None
        result["strategies_samples_per_second"] = {
            name: loop_samples_per_second(args, 2, file, args.data_root)
            for name, file in (("ddp", "ddp_cpu.yaml"), ("zero2", "deepspeed_cpu.yaml"), ("zero3", "deepspeed_zero3_cpu.yaml"))
        }
    emit_result(result, args.json)
    if args.plot:
        write_plot(args.plot, result)
    return 0


if __name__ == "__main__":
    exit_now(main())
