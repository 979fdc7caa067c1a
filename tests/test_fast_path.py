"""The fast-path keys (docs/performance.md#the-fast-path) change speed, not results: each gives the
losses of the default over 3 optimizer steps, on this machine's device (tests/test_gpu.py runs
the same on CUDA with the inductor backend)."""

import random

import pytest
import torch
from conftest import SAMPLE_VIDEOS

from models.metrics import LPIPS
from training.config.load import load_config
from training.config.schema import ConfigError
from training.data.decode import read_clip
from training.loop.build import build_model
from training.step.losses import compute_losses


def losses_over_three_steps(overrides: list[str], mixed_precision: str = "", device: str = "cpu") -> list[dict]:
    config = load_config("test", ["perceptual_weight=0.1", "reconstruction_weight=1.0", "n_frames=8", *overrides],
                         check_paths=False)
    if mixed_precision:  # read from the accelerate file in a real run
        config.mixed_precision = mixed_precision
    torch.manual_seed(0)
    student = build_model(config).to(device)
    lpips = LPIPS().to(device)  # random weights: a real network, not a meaningful metric
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    video = torch.rand(2, 8, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
    steps = []
    for _ in range(3):
        total, logged = compute_losses(config, student, video, None, None, lpips)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        steps.append({k: float(v) for k, v in logged.items()})
    return steps


def assert_same_losses(reference: list[dict], other: list[dict], rtol: float) -> None:
    assert [set(step) for step in reference] == [set(step) for step in other]
    for step, (a, b) in enumerate(zip(reference, other), 1):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=rtol, abs=1e-4), f"step {step} {key}: {a[key]} vs {b[key]}"


@pytest.fixture(scope="module")
def default_losses():
    return losses_over_three_steps(["channels_last=false"])


@pytest.mark.parametrize("overrides, rtol", [
    (["channels_last=true"], 1e-3),  # float rounding, grown by two Adam steps
    (["compile=true", "compile_backend=aot_eager"], 1e-3),  # the wiring; inductor itself on CUDA in test_gpu
])
def test_fast_path_keys_give_the_default_losses(overrides, rtol, default_losses):
    assert_same_losses(default_losses, losses_over_three_steps(overrides), rtol)


def test_lpips_in_bf16_gives_the_fp32_losses_to_bf16_rounding(default_losses):
    bf16 = losses_over_three_steps(["channels_last=false", "lpips_bf16=true"], mixed_precision="bf16")
    assert_same_losses(default_losses, bf16, 2e-2)
    assert bf16[0]["perceptual"] != default_losses[0]["perceptual"]  # it did run in bf16


def test_compile_is_refused_with_zero3_and_unknown_backends():
    with pytest.raises(ConfigError, match=r"compile=true with ZeRO-3 \(deepspeed_zero3_cpu.yaml\)"):
        load_config("test", ["compile=true", "accelerate_config=deepspeed_zero3_cpu.yaml"], check_paths=False)
    with pytest.raises(ConfigError, match=r"compile_backend='tensorrt': choose one of inductor, aot_eager, eager"):
        load_config("test", ["compile=true", "compile_backend=tensorrt"], check_paths=False)


@pytest.mark.skipif(not SAMPLE_VIDEOS.is_dir(), reason="../shared/data/videos not present")
def test_decoder_threads_give_the_same_frames():
    path = sorted(p for p in SAMPLE_VIDEOS.iterdir() if p.suffix == ".mp4")[0]
    clips = [read_clip(path, -1, 8, 1, 1, random.Random(0), loop_short=True, threads=threads)[0] for threads in (1, 2, 4)]
    assert all((clip == clips[0]).all() for clip in clips[1:])
