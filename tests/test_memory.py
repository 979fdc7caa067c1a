"""The memory estimate (training/plan/memory.py): the step measured on fake tensors against the same
step on real ones, every shipped GPU profile within 90% of its device, and a profile that does
not fit refused with the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, free_port, needs_compiler

from training.config.load import available_profiles, load_config
from training.config.schema import ConfigError
from training.plan.memory import GB, HEADROOM, budget_problem, estimate_memory, measure_step

GPU_PROFILES = {"1gpu_h100": 1, "h100": 8, "16gpu_h100": 16, "64gpu_h100": 64, "a800": 8}


# batch 1 where the step's own tensors still make the peak (half the real step's CPU time); the step
# without Seraena, and the checkpointed one, need 2 clips for that
@pytest.mark.parametrize("overrides, batch", [([], 1), (["gradient_checkpointing=true"], 2),
                                              (["channels_last=false", "seraena_weight=0"], 2)])
def test_the_fake_tensor_peak_matches_the_same_step_on_real_tensors(overrides, batch):
    """The h100 step (bf16, channels_last, every loss term, Seraena's discriminator step) at a small
    shape: measured on fake tensors as the dry run does at full shape, and run for real, the peaks
    agree within 10% (fake tensors must allocate what the real kernels allocate, layouts included).
    32x32, LPIPS's smallest: the step's own tensors are still more than half the peak, and the real
    bf16 step costs a third of 48x64's on a CPU (its bf16 convolutions take PyTorch's naive path here)."""
    config = load_config("h100", overrides, 8, check_paths=False)
    fake_weights, fake_peak = measure_step(config, fake=True, batch=batch, height=32, width=32)
    real_weights, real_peak = measure_step(config, fake=False, batch=batch, height=32, width=32)
    # the step's own tensors make most of the peak (DDP's fp32 weights are the rest: no engine cast to bf16)
    assert real_peak - real_weights > real_weights
    assert fake_weights == real_weights
    assert abs(fake_peak - real_peak) / real_peak < 0.10, (fake_peak, real_peak)


def test_the_step_grows_with_the_clips_and_shrinks_with_checkpointing_and_fewer_terms():
    full = load_config("h100", [], 8, check_paths=False)
    checkpointed = load_config("h100", ["gradient_checkpointing=true"], 8, check_paths=False)
    no_reference_decode = load_config("h100", ["decoder_weight=0", "seraena_weight=0", "perceptual_weight=0"], 8, check_paths=False)
    sizes = [measure_step(c, batch=2, height=64, width=64)[1] for c in (full, checkpointed, no_reference_decode)]
    assert sizes[0] > sizes[1] and sizes[0] > sizes[2]
    weights, doubled = measure_step(full, batch=4, height=64, width=64)
    assert doubled - weights > 1.5 * (sizes[0] - weights)  # twice the clips: most of the step doubles


def test_every_shipped_gpu_profile_fits_its_device():
    assert set(GPU_PROFILES) <= set(available_profiles())
    for profile, processes in GPU_PROFILES.items():
        config = load_config(profile, [], processes, check_paths=False)
        estimate = estimate_memory(config)
        assert budget_problem(config, estimate) == "", profile
        assert 10 < estimate.gpu_gb <= HEADROOM * config.gpu_memory_gb, (profile, estimate.gpu)  # the margin we ship with
        assert estimate.host_gb < 64 and estimate.checkpoint_gb > 0
        assert 1 < estimate.reference_encode_gb < estimate.gpu["training step"], (profile, estimate.reference_encode_gb)


def test_a_profile_over_its_gpu_memory_is_refused_with_the_fix():
    config = load_config("1gpu_h100", ["batch_size_per_gpu=8", "gradient_accumulation_steps=16"], 1, check_paths=False)
    problem = budget_problem(config, estimate_memory(config))
    assert problem.startswith("estimated GPU memory per rank ") and "exceeds gpu_memory_gb=80" in problem
    assert "gradient_checkpointing=true (about " in problem and "batch_size_per_gpu=" in problem and "\n" not in problem
    bigger = load_config("1gpu_h100", ["batch_size_per_gpu=8", "gradient_accumulation_steps=16", "gpu_memory_gb=200"], 1,
                         check_paths=False)
    assert budget_problem(bigger, estimate_memory(bigger)) == ""
    with pytest.raises(ConfigError, match="gpu_memory_gb=0.0 must be positive"):
        load_config("h100", ["gpu_memory_gb=0"], 8, check_paths=False)


def test_the_configs_make_gpu_check_runs_load_on_cpu():
    """tests/test_gpu.py's memory check and scripts/gpu_check.py's benchmark profile must resolve
    here: a config refused before anything runs would fail `make gpu-check` only on the GPU machine."""
    from test_gpu import MEMORY_CHECK_SETS

    config = load_config("test", MEMORY_CHECK_SETS, num_processes=1, check_paths=False)
    assert config.zero_stage == 2 and config.mixed_precision == "bf16" and config.n_frames == 8
    assert load_config("h100", [], 8, check_paths=False).batch_size_per_gpu > 0  # scripts.benchmark --profile h100


@needs_compiler
def test_deepspeed_exchanges_fp32_in_buckets_sized_to_the_student_and_the_estimate_counts_what_it_allocates(tmp_path):
    """The 1-GPU production file (ZeRO-2, bf16) on CPU: build_accelerator gives DeepSpeed an fp32
    gradient exchange (the fp32 accumulation is fed by an fp32 sum over ranks, not a bf16 one) and
    a reduce bucket of the student's size instead of DeepSpeed's 5e8 elements; the bytes the ZeRO
    optimizer holds in buckets during a real backward are what the memory estimate counts."""
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                             str(REPO_ROOT / "accelerate_configs" / "deepspeed_1gpu.yaml"), "--num_processes", "1",
                             "--main_process_port", str(free_port()), str(REPO_ROOT / "tests" / "deepspeed_buckets_run.py"),
                             str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert report["communication_data_type"] == "fp32" and report["engine_communication_dtype"] == "torch.float32"
    assert report["grad_accum_dtype"] == "fp32"
    params = report["parameters"]
    assert report["zero_optimization"] == {"reduce_bucket_size": params + params % 2, "allgather_bucket_size": params + params % 2,
                                           "overlap_comm": False}
    config = load_config("test", ["accelerate_config=deepspeed_1gpu.yaml"], 1, check_paths=False)
    assert report["bucket_bytes_during_backward"] == (params + params % 2) * 2  # one bf16 bucket (overlap_comm off)
    assert report["bucket_bytes_after_backward"] == 0  # released at the end of each backward
    assert estimate_memory(config).gpu["deepspeed buckets"] * GB == pytest.approx(report["bucket_bytes_during_backward"])


def test_measurements_are_kept_by_the_reference_architecture_not_its_folder(tmp_path):
    """A named family is measured in its published architecture wherever its weights lie (a dry run
    on a bare machine and one with the weights in place share the measurement); a VAE no family
    names, by its own config.json."""
    from types import SimpleNamespace

    from training.config.views import measured_values

    def vae_folder(name: str, channels: int):
        (tmp_path / name / "vae").mkdir(parents=True)
        (tmp_path / name / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLCosmos",
                                                                          "latent_channels": channels}))
        return str(tmp_path / name)

    def values(path: str, geometry: dict) -> list:
        return measured_values(SimpleNamespace(ref_vae_path=path, reference_geometry=geometry, latent_cache="/data/cache"),
                               ("ref_vae_path", "latent_cache"))

    assert values("pretrained/CogVideoX-2b", {}) == values("/elsewhere", {}) == ["", True]
    measured = {name: values(vae_folder(name, channels), {"class_name": "AutoencoderKLCosmos"})
                for name, channels in (("a", 16), ("copy_of_a", 16), ("b", 8))}
    assert measured["a"] == measured["copy_of_a"] != measured["b"]
