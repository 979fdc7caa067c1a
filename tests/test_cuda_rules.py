"""The bf16 step held to CUDA's dtype rules on the CPU (tests/cuda_rules.py), and the adaptive
adversarial weight under a real DeepSpeed ZeRO-2 engine. The first H100 run stopped at its first
backward: mse_loss got an fp32 prediction and the bf16 video, which CUDA refuses and the CPU
accepts; the adaptive weight's autograd.grad crashed DeepSpeed's gradient reduction
(../shared/reference/gpu-h100-2026-11.md)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO_ROOT, free_port, needs_compiler
from cuda_rules import CudaDtypeRules

from training.config.load import load_config


def test_the_rules_refuse_two_dtypes_in_a_loss_kernel_as_cuda_does():
    prediction = torch.rand(2, 3, requires_grad=True)
    with CudaDtypeRules() as rules:
        with pytest.raises(TypeError, match=r"mse_loss got floating tensors of \['torch.bfloat16', 'torch.float32'\]"):
            F.mse_loss(prediction, torch.rand(2, 3).bfloat16())
        F.mse_loss(prediction, torch.rand(2, 3)).backward()  # one dtype: fine, forward and backward
        with pytest.raises(TypeError, match="index_put"):
            torch.zeros(4).index_put_((torch.tensor([1]),), torch.ones(1, dtype=torch.bfloat16))
    assert rules.checked["mse_loss_backward"] == 1


def bf16_student(config):
    """The student as a bf16 DeepSpeed engine holds it: the module itself in bf16."""
    from training.loop.build import build_model

    torch.manual_seed(0)
    return build_model(config).to(torch.bfloat16)


def seraena_in_bf16(config, student):
    """Seraena as build_seraena makes it on a bf16 GPU run: its discriminator under bf16 autocast."""
    from types import SimpleNamespace

    from training.loop.build import build_seraena

    seraena = build_seraena(config, SimpleNamespace(device=torch.device("cpu"), process_index=0), student.taehv)
    seraena.seraena.amp_dtype = torch.bfloat16  # forced on: a CPU run keeps it off (no fast bf16 convolutions)
    return seraena


# bf16 convolutions are 30x slower than fp32 on a CPU without bf16 instructions: the fewest clips that
# give Seraena's BatchNorm 2 frame groups, of 32x32 (LPIPS's smallest)
EVERY_TERM = ["accelerate_config=deepspeed_1gpu.yaml", "perceptual_weight=0.1", "temporal_weight=0.1", "seraena_weight=0.1", "chroma_weight=0.1",
              "adaptive_adversarial=true", "lpips_bf16=true"]
# 8 frames decode to 5: one group per clip; the cpu profile's block-average start (its weights in bf16)
AUTOENCODER = ["use_ref_vae=false", "batch_size_per_gpu=2", "student_start=block_average"]
DISTILL = ["use_ref_vae=true", "n_frames=9", "encoder_weight=0.1", "decoder_weight=0.1", "batch_size_per_gpu=1"]  # 3 groups


@pytest.mark.parametrize("mode", ["autoencoder", "cached latents"])
def test_a_bf16_step_in_each_mode_feeds_every_loss_kernel_one_dtype(mode):
    """One bf16 micro-step, every loss term on, under CUDA's rules: autoencoder mode, and
    distillation from a latent cache (stored in bf16, as scripts/cache_latents.py writes it). Its
    convolutions run as the trainer runs them on a CPU (models/cpu_bf16.py: same dtypes in and out)."""
    from models.cpu_bf16 import bf16_convolutions
    from models.metrics import LPIPS
    from training.loop.step import reference_latents_for
    from training.step.losses import add_seraena_term, forward_losses

    distill = mode == "cached latents"
    sets = [*EVERY_TERM, *(DISTILL if distill else AUTOENCODER)]
    config = load_config("test", sets, 1, check_paths=False)
    student = bf16_student(config)
    seraena, lpips = seraena_in_bf16(config, student), LPIPS().requires_grad_(False)
    clips = config.batch_size_per_gpu
    video = torch.rand(clips, config.n_frames, 3, 32, 32)  # fp32 in [0, 1], as the loop makes it
    batch = {"latents": torch.randn(clips, 3, 16, 4, 4).bfloat16()} if distill else {}
    run = type("Run", (), {"reference_vae": None})()
    with bf16_convolutions(torch.device("cpu"), torch.bfloat16), CudaDtypeRules() as rules:
        latents = reference_latents_for(run, batch, video)
        losses = forward_losses(config, student, video, latents, lpips, step=0)
        total = add_seraena_term(config, seraena, losses, last_layer=student.last_layer)
        total.backward()
    assert rules.checked["mse_loss_backward"] >= 2  # Seraena's term and the discriminator's step at least
    assert {"perceptual", "temporal", "seraena", "seraena_adaptive_weight"} <= losses.logged.keys()
    assert torch.isfinite(total) and all(p.grad is not None for p in student.taehv.decoder.parameters())


def test_the_step_benchmark_runs_the_trainers_step_under_cudas_rules():
    """scripts/benchmark.py --profile times the loop's loss code: in bf16 it must keep the rules too
    (the H100 run stopped there as well), the adaptive weight included."""
    from scripts.benchmark import profile_step_time

    config = load_config("test", [*EVERY_TERM, *AUTOENCODER], 1, check_paths=False)
    with CudaDtypeRules() as rules:
        seconds = profile_step_time(config, torch.device("cpu"), steps=1, cached_latents=True, warmup=1)
    assert seconds > 0 and rules.checked["mse_loss_backward"] > 0


def tensorboard_scalars(run_dir, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "logs" / "taehv"))
    events.Reload()
    return [event.value for event in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


@pytest.mark.slow
@needs_compiler
def test_zero2_bf16_with_two_processes_keeps_cudas_rules_and_survives_the_adaptive_weights_start(tmp_path):
    """A real accelerate launch of two processes on the production ZeRO-2 bf16 file, distilling
    from a real (tiny) CogVideoX VAE with every loss term on, inside the step probe
    (tests/step_probe.py): each micro-step runs under CUDA's dtype rules, and the adversarial term
    with the adaptive weight starts at step 2 of 3 (the vidtok recipe starts it at step 20,000: with
    the weight measured by autograd.grad with respect to the decoder's weight, every DeepSpeed rank
    died right there). The weight equals plain fp32 autograd's; no convolution shape is first met
    after the first optimizer step. The engines in autoencoder mode: tests/test_launchers.py."""
    from models.metrics import save_random_lpips_weights
    from models.reference_vae import tiny_reference_vae_config, vae_class
    from training.data.synthetic_clips import make_sample_videos

    make_sample_videos(tmp_path / "clips", count=6, n_frames=24)
    backbone, heads = save_random_lpips_weights(tmp_path / "lpips")
    torch.manual_seed(0)
    vae_class("cogvideox")(**tiny_reference_vae_config("cogvideox")).save_pretrained(str(tmp_path / "vae" / "vae"))
    run_dir = tmp_path / "run"
    sets = [f"data_root={tmp_path / 'clips'}", "accelerate_config=deepspeed_8gpu.yaml", "use_ref_vae=true",
            "ref_vae_family=cogvideox", f"ref_vae_path={tmp_path / 'vae'}", "n_frames=9", "batch_size_per_gpu=1",
            "encoder_weight=0.1", "decoder_weight=0.1", "perceptual_weight=0.1", f"lpips_backbone_path={backbone}",
            f"lpips_weights_path={heads}", "temporal_weight=0.1", "seraena_weight=0.1", "seraena_schedule=(1,0)",
            "adaptive_adversarial=true", "max_steps=3", "validation_steps=3", "checkpointing_steps=3"]
    command = [sys.executable, "-m", "training.base.launch", "--config_file",
               str(REPO_ROOT / "accelerate_configs" / "deepspeed_8gpu.yaml"), "--num_processes", "2", "--num_machines", "1",
               "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
               str(REPO_ROOT / "training" / "taehv_train.py"), "--config", "test", "--output-dir", str(run_dir),
               *(arg for item in sets for arg in ("--set", item))]
    reports_dir = tmp_path / "reports"
    reports_dir.mkdir()
    env = {**os.environ, "TAEHV_STEP_PROBE": str(reports_dir), "PYTHONPATH": str(REPO_ROOT / "tests" / "probe_site")}
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    reports = [json.loads(path.read_text()) for path in sorted(reports_dir.glob("rank*.json"))]
    assert len(reports) == 2 and all(r["exit_code"] == 0 and r["checked"].get("mse_loss_backward", 0) > 0 for r in reports)
    assert all(r["late_convolutions"] == [] for r in reports), [r["late_convolutions"][:3] for r in reports]
    adaptive = [pair for r in reports for pair in r["adaptive"]]
    assert len(adaptive) == 4 and all(w == pytest.approx(plain, rel=5e-2) for w, plain in adaptive), adaptive  # steps 2, 3
    assert "fell back to 1.0" not in output
    prints = dict(re.findall(r"rank (\d) of 2: final weights fingerprint ([0-9a-f]{16})", output))
    assert len(prints) == 2 and prints["0"] == prints["1"], prints  # both ranks hold the same weights
    assert "2 processes | ZeRO 2" in result.stdout
    weights = tensorboard_scalars(run_dir, "train/seraena_adaptive_weight")
    assert len(weights) == 2, weights  # steps 2 and 3, after the term's start
    assert tensorboard_scalars(run_dir, "train/seraena_weight") == pytest.approx([0.0, 0.1, 0.1])
