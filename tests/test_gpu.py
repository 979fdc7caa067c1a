"""CUDA-only checks: `pytest -m gpu`, run by `make gpu-check` on one GPU (docs/performance.md).
Without CUDA every test here is skipped with the reason; the CPU halves of the same checks are
in test_fast_path.py, test_memory.py and test_training.py."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, free_port

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU (make gpu-check runs these on one)")]
LAUNCHER = str(REPO_ROOT / "train_taehv_h100.sh")
# the memory check's run on the test profile (autoencoder mode: n_frames a multiple of 4); a CPU test
# (tests/test_memory.py) loads it, so a config this file needs cannot be refused only on a GPU machine
MEMORY_CHECK_SETS = ["accelerate_config=deepspeed_1gpu.yaml", "height=256", "width=256", "n_frames=8", "model_variant=taecvx",
                     "batch_size_per_gpu=4", "seraena_weight=0.1", "log_every=1", "validation_steps=3", "checkpointing_steps=3"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


def launch(args: list[str], extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port()), **(extra_env or {})}
    return subprocess.run([LAUNCHER, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_bf16_deepspeed_steps_and_a_real_out_of_memory_skipped_on_one_gpu(clips, tmp_path):
    """The 1-GPU production accelerate file (ZeRO-2, bf16) on a real GPU; micro-step 2's forward
    asks for 1 PiB: a real CUDA out-of-memory error, skipped by the agreement, then training goes on."""
    run_dir = tmp_path / "run"
    result = launch(["1", "test", "--output-dir", str(run_dir), "--max-steps", "4", "--set", f"data_root={clips}",
                     "--set", "accelerate_config=deepspeed_1gpu.yaml", "--set", "seraena_weight=0.1", "--set", "batch_size_per_gpu=2",
                     "--set", "height=64", "--set", "width=64"],
                    {"TAEHV_FAULT_OOM_MICRO_STEPS": "2", "TAEHV_FAULT_REAL_OOM": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "1 processes | ZeRO 2" in log and "Step 4/4" in log and "GPU: " in log
    assert "out of memory on rank 0 at micro-step 2 (step 2): skipped on all ranks" in log
    assert json.loads((run_dir / "resolved_config.json").read_text())["mixed_precision"] == "bf16"


def test_fused_adamw_tf32_and_cudnn_benchmark():
    from training.config.load import load_config
    from training.loop.build import build_model, configure_cuda
    from training.step.optimizer import build_optimizer

    config = load_config("test", check_paths=False)
    configure_cuda(config)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.benchmark
    optimizer, _ = build_optimizer(config, build_model(config).cuda())
    assert optimizer.defaults["fused"]


@pytest.mark.parametrize("overrides", [["channels_last=true"], ["compile=true", "compile_backend=inductor"],
                                       ["channels_last=true", "compile=true"]])
def test_fast_path_keys_give_the_default_losses_on_cuda(overrides):
    from test_fast_path import assert_same_losses, losses_over_three_steps

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # compare fp32 with fp32
    default = losses_over_three_steps(["channels_last=false"], device="cuda")
    assert_same_losses(default, losses_over_three_steps(overrides, device="cuda"), 1e-3)


def test_memory_estimate_within_15_percent_of_the_measured_peak(clips, tmp_path):
    """The estimate per rank (training/plan/memory.py) against the run's peak torch.cuda memory
    (train/peak_memory_gb: max_memory_allocated over a log interval, which holds no CUDA context),
    in the intervals after the first: the first holds cuDNN's autotuning, which tries algorithms
    with whatever workspace is free (and skips those that do not fit, so it never runs a rank out
    of memory). The estimate's measured parts (all but the cuDNN workspace allowance and the CUDA
    context) are within 15% of that peak from below, and with the allowance within 15% from above."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from training.config.load import load_config
    from training.plan.memory import estimate_memory

    sets = MEMORY_CHECK_SETS + [f"data_root={clips}"]
    run_dir = tmp_path / "run"
    result = launch(["1", "test", "--output-dir", str(run_dir), "--max-steps", "3",
                     *[arg for item in sets for arg in ("--set", item)]])
    assert result.returncode == 0, result.stderr[-3000:]
    events = EventAccumulator(str(run_dir / "logs" / "taehv"))
    events.Reload()
    peaks = [e.value for e in events.Scalars("train/peak_memory_gb")]
    assert len(peaks) >= 3, peaks  # log_every=1; validation and the checkpoint come after step 3's line
    measured = max(peaks[1:3])
    estimate = estimate_memory(load_config("test", sets, num_processes=1, check_paths=False))
    allowance = estimate.gpu["cuDNN workspace"]
    measured_parts = estimate.gpu_gb - estimate.gpu["CUDA context"] - allowance
    print(f"estimated {measured_parts:.2f} GB + {allowance:.2f} GB cuDNN allowance, measured peak {measured:.2f} GB "
          f"(intervals {', '.join(f'{p:.2f}' for p in peaks)}): {estimate.gpu}")
    assert measured >= 0.85 * measured_parts, (measured_parts, measured, estimate.gpu)  # nothing counted that is not there
    assert measured <= 1.15 * (measured_parts + allowance), (measured_parts, measured, estimate.gpu)  # nothing missed


def test_benchmark_of_the_h100_profile_reports_clips_per_second_and_mfu(tmp_path):
    from scripts.gpu_check import benchmark_limit_s

    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "scripts.benchmark", "--profile", "h100", "--steps", "3",
                             "--latents", "cached", "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=benchmark_limit_s(3))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    # the step against the fastest bf16 matmul or convolution this GPU ran alone (scripts/benchmark.py)
    assert report["clips_per_s_per_gpu"] > 0 and 0 < report["mfu_vs_measured_peak"] <= 1, report["measured_peak_kernel"]
    assert re.search(r"spec dense bf16|no spec peak", report["spec_peak"])
