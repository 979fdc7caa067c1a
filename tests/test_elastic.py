"""Resume on CPU with real DeepSpeed engines and DDP. Elastic: a checkpoint written by 2 processes
under ZeRO-2 continues on 1 plain process and under ZeRO-3, and one written by 1 process continues
on 2 DDP processes, each with the same weights and optimizer state (the loop re-gathers the loaded
state and compares its fingerprint with the saved one; a difference is an error). Exact: on every
engine (1 plain process, 2 DDP processes, ZeRO-2, ZeRO-3) a resume continues as the run it resumes
did, bit for bit (the same runs serve both: each elastic run trains one step more, and the exact
resume of its middle checkpoint must reach its last)."""

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


def checkpoint(run_dir, step):
    return run_dir / "checkpoints" / f"checkpoint-{step}"


def assert_exact_resume(resumed, resumed_dir, uninterrupted_dir, start: int, steps: int) -> None:
    """A resume of `uninterrupted_dir`'s checkpoint-<start> that trained to `steps`: weights, both AdamW
    moments and the optimizer's step count (the state fingerprint), the data position, accelerate's step
    counter and Python's and NumPy's generators equal the uninterrupted run's at each checkpoint after
    it, and so do its losses."""
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    saved = json.loads((checkpoint(uninterrupted_dir, start) / "topology.json").read_text())
    assert (f"resumed from {checkpoint(uninterrupted_dir, start)} at step {start} (weights and optimizer state identical: "
            f"fingerprint {saved['state_fingerprint']})") in resumed.stdout
    uninterrupted_log = (uninterrupted_dir / "train.log").read_text()
    for step in range(start + 1, steps + 1):
        ours, theirs = (json.loads((checkpoint(d, step) / "topology.json").read_text()) for d in (resumed_dir, uninterrupted_dir))
        assert (ours["state_fingerprint"], ours["micro_step"]) == (theirs["state_fingerprint"], theirs["micro_step"]), step
        for rank in range(saved["num_processes"]):
            name = f"random_states_{rank}.pt"
            ours, theirs = (torch.load(checkpoint(d, step) / name, weights_only=True) for d in (resumed_dir, uninterrupted_dir))
            assert ours["step"] == theirs["step"] and ours["python"] == theirs["python"], (step, rank)
            assert torch.equal(ours["numpy"]["key"], theirs["numpy"]["key"]), (step, rank)
            # torch's CPU generator too: a resume mid-epoch starts a DataLoader iterator where the uninterrupted
            # run had one running, whose base seed comes from the loader's own generator (build_train_loader)
            assert torch.equal(ours["torch"], theirs["torch"]), (step, rank)
        assert step_loss(resumed.stdout, step) == step_loss(uninterrupted_log, step)


@pytest.fixture(scope="module")
def two_process_run(clips, tmp_path_factory):
    """One 2-process ZeRO-2 run of 3 steps (a checkpoint each), shared by the resume and conversion tests."""
    run_dir = tmp_path_factory.mktemp("two") / "run"
    first = launch(2, run_dir, clips, 3)
    assert first.returncode == 0, first.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_resume_across_process_counts_and_zero_stages_and_exactly_on_every_engine(clips, two_process_run, tmp_path):
    saved = checkpoint(two_process_run, 2)
    topology = json.loads((saved / "topology.json").read_text())
    assert topology["num_processes"] == 2 and topology["zero_stage"] == 2 and topology["micro_step"] == 2
    full = torch.load(saved / "full_state.pt", weights_only=True)
    assert set(full) == {"weights", "exp_avg", "exp_avg_sq", "optimizer_step"}
    assert any(v.abs().sum() > 0 for v in full["exp_avg_sq"].values())  # real optimizer state, not zeros

    # elastic: to 1 plain process and to ZeRO-3, two steps each (a checkpoint after each)
    cases = [
        (1, "ddp_cpu.yaml", "2 processes ZeRO 2 -> 1 processes ZeRO 0"),
        (2, "deepspeed_zero3_cpu.yaml", "2 processes ZeRO 2 -> 2 processes ZeRO 3"),
    ]
    for ngpu, accelerate_file, change in cases:
        run_dir = tmp_path / f"{ngpu}_{accelerate_file}"
        result = launch(ngpu, run_dir, clips, 4, accelerate_file, resume=saved)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (f"resumed elastically from {saved} at step 2: {change}; weights and optimizer state identical "
                f"(fingerprint {topology['state_fingerprint']})") in result.stdout
        assert "Step 4/4" in result.stdout
        if ngpu == 1:
            # 2 batches on each of 2 ranks = 4 samples of 1: the single process continues at batch 4
            assert json.loads((checkpoint(run_dir, 3) / "topology.json").read_text())["micro_step"] == 5
    one, zero3 = tmp_path / "1_ddp_cpu.yaml", tmp_path / "2_deepspeed_zero3_cpu.yaml"

    # exact, ZeRO-2: the run's own checkpoint-2 continues as the run did
    exact = launch(2, tmp_path / "exact_zero2", clips, 3, resume=saved)
    assert_exact_resume(exact, tmp_path / "exact_zero2", two_process_run, 2, 3)
    # same process count: the ZeRO-3 continuation takes the very step the exact ZeRO-2 resume takes
    assert step_loss(exact.stdout, 3) == step_loss((zero3 / "train.log").read_text(), 3)
    # exact, one plain process and ZeRO-3: each elastic run's checkpoint-3 continues to its checkpoint-4
    for uninterrupted, ngpu, accelerate_file in ((one, 1, "ddp_cpu.yaml"), (zero3, 2, "deepspeed_zero3_cpu.yaml")):
        resumed = launch(ngpu, tmp_path / f"exact_{uninterrupted.name}", clips, 4, accelerate_file,
                         resume=checkpoint(uninterrupted, 3))
        assert_exact_resume(resumed, tmp_path / f"exact_{uninterrupted.name}", uninterrupted, 3, 4)

    # elastic back to two DDP processes, then exact under DDP
    back = launch(2, tmp_path / "back_to_two", clips, 5, "ddp_cpu.yaml", resume=checkpoint(one, 3))
    assert back.returncode == 0, back.stderr[-3000:]
    assert "1 processes ZeRO 0 -> 2 processes ZeRO 0" in back.stdout and "Step 5/5" in back.stdout
    ddp = launch(2, tmp_path / "exact_ddp", clips, 5, "ddp_cpu.yaml", resume=checkpoint(tmp_path / "back_to_two", 4))
    assert_exact_resume(ddp, tmp_path / "exact_ddp", tmp_path / "back_to_two", 4, 5)


@pytest.mark.slow
def test_convert_checkpoint_writes_one_public_file_from_zero_shards(two_process_run, tmp_path):
    from models.taehv import TAEHV
    from scripts.convert_checkpoint import main as convert

    last = checkpoint(two_process_run, 3)  # the step final/ was exported at
    masters = torch.load(last / "full_state.pt", weights_only=True)["weights"]
    assert convert([str(last), "--out", str(tmp_path / "model"), "--weights", "model", "--dtype", "bf16"]) == 0
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["model_info.json", "taehv.pth", "taehv.safetensors"]
    model = TAEHV.from_pretrained(tmp_path / "model" / "taehv.safetensors")  # variant from model_info.json
    assert model.variant == "taehv"
    for name, value in model.state_dict().items():
        assert torch.equal(value, masters[f"taehv.{name}"].to(torch.bfloat16).float())
    assert convert([str(last), "--out", str(tmp_path / "ema" / "taehv.pth")]) == 0
    exported = torch.load(two_process_run / "final" / "taehv.pth", weights_only=True)
    converted = torch.load(tmp_path / "ema" / "taehv.pth", weights_only=True)
    assert all(torch.equal(exported[k], converted[k]) for k in exported)  # the EMA is what final/ holds
    assert convert([str(last), "--out", str(tmp_path / "x.bin")]) == 2
    # a name upstream's taehv.py would build another architecture from is refused
    assert convert([str(last), "--out", str(tmp_path / "taecvx.pth")]) == 2
    assert convert([str(last), "--out", str(tmp_path / "taehv1_5_mine.pth")]) == 2
