"""The memory estimate (training/memory.py): its scaling checked against counted bytes, every
shipped GPU profile inside its device, and a profile that is not refused with the fix."""

from __future__ import annotations

import pytest

from training.config import ConfigError, available_profiles, load_config
from training.memory import PROBE_SIDE, budget_problem, estimate_memory, saved_activation_bytes

GPU_PROFILES = {"1gpu_h100": 1, "h100": 8, "16gpu_h100": 16, "64gpu_h100": 64, "a800": 8}


@pytest.mark.parametrize("batch, frames_size", [(2, (96, 128)), (1, (128, 160))])
def test_activation_estimate_matches_the_bytes_counted_at_other_shapes(batch, frames_size):
    """Scaled from the probe (1 clip at PROBE_SIDE^2), the estimate must be within 25% of the
    saved-tensor bytes counted directly at a shape with other batch, height and width."""
    config = load_config("h100", [], 8, check_paths=False)  # bf16, every loss term, the reference decode
    probe = saved_activation_bytes(config, 1, config.n_frames, PROBE_SIDE, PROBE_SIDE)
    height, width = frames_size
    estimated = probe / (PROBE_SIDE * PROBE_SIDE) * batch * height * width
    counted = saved_activation_bytes(config, batch, config.n_frames, height, width)
    assert abs(estimated - counted) / counted < 0.25, (estimated, counted)


@pytest.mark.parametrize("overrides", [[], ["gradient_checkpointing=true"]])
def test_the_fast_fp32_count_matches_a_bf16_forward(overrides):
    """The probe runs in fp32 (bf16 convolutions are ~20x slower on CPUs) and counts what the
    student's forward saves at bf16 size: within 2% of the bytes a bf16 forward saves."""
    config = load_config("h100", overrides, 8, check_paths=False)
    fast = saved_activation_bytes(config, 1, config.n_frames, 32, 32)
    exact = saved_activation_bytes(config, 1, config.n_frames, 32, 32, exact=True)
    assert abs(fast - exact) / exact < 0.02, (fast, exact)


def test_gradient_checkpointing_and_fewer_loss_terms_need_less():
    full = load_config("h100", [], 8, check_paths=False)
    checkpointed = load_config("h100", ["gradient_checkpointing=true"], 8, check_paths=False)
    no_reference_decode = load_config("h100", ["decoder_weight=0", "seraena_weight=0", "perceptual_weight=0"], 8, check_paths=False)
    sizes = [saved_activation_bytes(c, 1, 9, 32, 32) for c in (full, checkpointed, no_reference_decode)]
    assert sizes[0] > sizes[1] and sizes[0] > sizes[2]


def test_every_shipped_gpu_profile_fits_its_device():
    assert set(GPU_PROFILES) <= set(available_profiles())
    for profile, processes in GPU_PROFILES.items():
        config = load_config(profile, [], processes, check_paths=False)
        estimate = estimate_memory(config)
        assert budget_problem(config, estimate) == "", profile
        assert 10 < estimate.gpu_gb <= config.gpu_memory_gb, (profile, estimate.gpu)
        assert estimate.host_gb < 64 and estimate.checkpoint_gb > 0


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
