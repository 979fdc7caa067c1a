"""Elastic resume on CPU with real DeepSpeed engines: a checkpoint written by 2 processes under
ZeRO-2 continues on 1 process and under ZeRO-3, and one written by 1 process continues on 2, each
with the same weights and optimizer state (the loop re-gathers the loaded state and compares its
fingerprint with the saved one; a difference is an error)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, free_port, needs_compiler

from training.data.synthetic_clips import make_sample_videos

pytestmark = needs_compiler  # every test here runs DeepSpeed on CPU


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


def launch(ngpu, run_dir, clips, max_steps, accelerate_file="deepspeed_cpu.yaml", resume=None):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    args = [str(REPO_ROOT / "train_taehv_h100.sh"), str(ngpu), "test", "--output-dir", str(run_dir),
            "--max-steps", str(max_steps), "--set", f"data_root={clips}", "--set", f"accelerate_config={accelerate_file}",
            "--set", "checkpointing_steps=1", "--set", "validation_steps=1"]
    args += ["--resume", str(resume)] if resume else []
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)


def step_loss(log: str, step: int) -> str:
    return re.search(rf"Step {step}/\d+ \| Loss: ([\d.]+)", log).group(1)


@pytest.fixture(scope="module")
def two_process_run(clips, tmp_path_factory):
    """One 2-process ZeRO-2 run of 2 steps, shared by the resume and conversion tests."""
    run_dir = tmp_path_factory.mktemp("two") / "run"
    first = launch(2, run_dir, clips, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_resume_across_process_counts_and_zero_stages(clips, two_process_run, tmp_path):
    saved = two_process_run / "checkpoints" / "checkpoint-2"
    topology = json.loads((saved / "topology.json").read_text())
    assert topology["num_processes"] == 2 and topology["zero_stage"] == 2 and topology["micro_step"] == 2
    full = torch.load(saved / "full_state.pt", weights_only=True)
    assert set(full) == {"weights", "exp_avg", "exp_avg_sq", "optimizer_step"}
    assert any(v.abs().sum() > 0 for v in full["exp_avg_sq"].values())  # real optimizer state, not zeros

    cases = [
        (1, "deepspeed_cpu.yaml", "2 processes ZeRO 2 -> 1 processes ZeRO 2"),
        (2, "deepspeed_zero3_cpu.yaml", "2 processes ZeRO 2 -> 2 processes ZeRO 3"),
    ]
    for ngpu, accelerate_file, change in cases:
        run_dir = tmp_path / f"{ngpu}_{accelerate_file}"
        result = launch(ngpu, run_dir, clips, 3, accelerate_file, resume=saved)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (f"resumed elastically from {saved} at step 2: {change}; weights and optimizer state identical "
                f"(fingerprint {topology['state_fingerprint']})") in result.stdout
        assert "Step 3/3" in result.stdout
        if ngpu == 1:
            # 2 batches on each of 2 ranks = 4 samples of 1: the single process continues at batch 4
            assert json.loads((run_dir / "checkpoints" / "checkpoint-3" / "topology.json").read_text())["micro_step"] == 5

    # same process count: the ZeRO-3 continuation takes the very step accelerate's exact ZeRO-2 resume takes
    exact = launch(2, tmp_path / "exact", clips, 3, resume=saved)
    assert exact.returncode == 0 and f"resumed from {saved} at step 2" in exact.stdout, exact.stderr[-3000:]
    zero3_log = (tmp_path / "2_deepspeed_zero3_cpu.yaml" / "train.log").read_text()
    assert step_loss(exact.stdout, 3) == step_loss(zero3_log, 3)

    one = tmp_path / "1_deepspeed_cpu.yaml" / "checkpoints" / "checkpoint-3"
    back = launch(2, tmp_path / "back_to_two", clips, 4, resume=one)
    assert back.returncode == 0, back.stderr[-3000:]
    assert "1 processes ZeRO 2 -> 2 processes ZeRO 2" in back.stdout and "Step 4/4" in back.stdout


@pytest.mark.slow
def test_convert_checkpoint_writes_one_public_file_from_zero_shards(two_process_run, tmp_path):
    from models.taehv import TAEHV
    from scripts.convert_checkpoint import main as convert

    checkpoint = two_process_run / "checkpoints" / "checkpoint-2"
    masters = torch.load(checkpoint / "full_state.pt", weights_only=True)["weights"]
    assert convert([str(checkpoint), "--out", str(tmp_path / "model"), "--weights", "model", "--dtype", "bf16"]) == 0
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["model_info.json", "taehv.pth", "taehv.safetensors"]
    model = TAEHV.from_pretrained(tmp_path / "model" / "taehv.safetensors")  # variant from model_info.json
    assert model.variant == "taehv"
    for name, value in model.state_dict().items():
        assert torch.equal(value, masters[f"taehv.{name}"].to(torch.bfloat16).float())
    assert convert([str(checkpoint), "--out", str(tmp_path / "ema" / "taehv.pth")]) == 0
    exported = torch.load(two_process_run / "final" / "taehv.pth", weights_only=True)
    converted = torch.load(tmp_path / "ema" / "taehv.pth", weights_only=True)
    assert all(torch.equal(exported[k], converted[k]) for k in exported)  # the EMA is what final/ holds
    assert convert([str(checkpoint), "--out", str(tmp_path / "x.bin")]) == 2
    # a name upstream's taehv.py would build another architecture from is refused
    assert convert([str(checkpoint), "--out", str(tmp_path / "taecvx.pth")]) == 2
    assert convert([str(checkpoint), "--out", str(tmp_path / "taehv1_5_mine.pth")]) == 2
