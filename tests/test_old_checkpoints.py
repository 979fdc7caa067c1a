"""Checkpoints written by older code resume with today's, and no checkpoint file runs code.

The older code is taken from the repository's history at test time (`git archive`) and run with the
same interpreter, so its checkpoints hold what that code really wrote, not today's states renamed.
PREVIOUS_RELEASE is the last commit before the checkpoint held each tensor once (f5f3550): beside
full_state.pt it wrote accelerate's model and optimizer files (DDP) or DeepSpeed's shards, random
states pickled with NumPy arrays, the replay buffer as a list of entries, and Seraena's AdamW
unfused (its param groups say fused=None, which refused the fused step's found_inf after a resume).
The oldest layout (accelerate's positional custom_checkpoint_<i>.pkl, rank 0's Seraena state inside
Seraena's, before 2c777f5) is made from that code's checkpoint by moving its files, as that code
placed them. Every format is read through full_state.pt, so the engine-specific loaders are the
ones tests/test_elastic.py checks on every engine; here each format resumes on 1 plain process,
ZeRO-2 and DDP."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, free_port, needs_compiler, to_positional_layout

from training.config.load import load_config
from training.plan.memory import checkpoint_cost
from training.run.checkpoint_files import CheckpointFileError, load_file

PREVIOUS_RELEASE = "32edcf3"
SETS = ["seraena_weight=0.1", "batch_size_per_gpu=2"]  # Seraena's BatchNorm needs 2 frame groups per rank


@pytest.fixture(scope="module")
def old_code(tmp_path_factory) -> Path:
    if subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
                      capture_output=True).returncode != 0:
        pytest.skip(f"commit {PREVIOUS_RELEASE} is not in this checkout's history (a shallow clone or an archive)")
    folder = tmp_path_factory.mktemp("previous_release")
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", PREVIOUS_RELEASE], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


def launch(code: Path, ngpu: int, run_dir: Path, steps: int, sets=(), resume: str | None = None):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    args = [str(code / "train_taehv_h100.sh"), str(ngpu), "test", "--output-dir", str(run_dir), "--max-steps", str(steps)]
    args += ["--resume", resume] if resume else []
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, cwd=code, env=env, capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def old_runs(old_code, clips, tmp_path_factory) -> dict:
    """One step, then a checkpoint, by the previous release: on 1 plain process and on 2 under ZeRO-2."""
    runs = {}
    for name, ngpu, accelerate_file in (("plain", 1, "ddp_cpu.yaml"), ("zero2", 2, "deepspeed_cpu.yaml")):
        run_dir = tmp_path_factory.mktemp(name) / "run"
        result = launch(old_code, ngpu, run_dir, 1, [f"data_root={clips}", f"accelerate_config={accelerate_file}", *SETS])
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = run_dir
    return runs


def assert_resumed(result, checkpoint: Path, elastic: str = "") -> None:
    """Resumed with the weights and AdamW state the checkpoint recorded, and trained a step on."""
    assert result.returncode == 0, result.stderr[-3000:]
    fingerprint = json.loads((checkpoint / "topology.json").read_text())["state_fingerprint"]
    if elastic:
        assert f"resumed elastically from {checkpoint} at step 1: {elastic}; weights and optimizer state identical " \
               f"(fingerprint {fingerprint})" in result.stdout
    else:
        assert f"resumed from {checkpoint} at step 1 (weights and optimizer state identical: fingerprint {fingerprint}); " \
               "Seraena replay buffer and random state per rank" in result.stdout
    assert "Step 2/2" in result.stdout


@pytest.mark.slow
@needs_compiler  # the 2-process runs are ZeRO-2 on CPU
def test_checkpoints_of_the_previous_release_and_the_oldest_layout_resume_and_train_on(old_runs, clips, tmp_path):
    plain, zero2 = old_runs["plain"], old_runs["zero2"]
    assert (plain / "checkpoints" / "checkpoint-1" / "optimizer.bin").is_file()  # what that code wrote
    assert (zero2 / "checkpoints" / "checkpoint-1" / "pytorch_model").is_dir()
    seraena = torch.load(plain / "checkpoints" / "checkpoint-1" / "seraena_state.pt", weights_only=True)
    assert seraena["training"]["optimizer"]["param_groups"][0]["fused"] is None
    # the oldest layout, made from the 2-process checkpoint before it is resumed in place
    oldest = tmp_path / "oldest"
    shutil.copytree(zero2, oldest)
    to_positional_layout(oldest / "checkpoints" / "checkpoint-1")

    for run_dir, ngpu in ((plain, 1), (zero2, 2)):  # exact: in place, on the engine that wrote it
        result = launch(REPO_ROOT, ngpu, run_dir, 2, resume="latest")
        assert_resumed(result, run_dir / "checkpoints" / "checkpoint-1")
    written = plain / "checkpoints" / "checkpoint-2"  # today's format, weighing what the plan says
    assert (written / "random_states_0.pt").is_file() and not (written / "optimizer.bin").exists()
    planned = checkpoint_cost(load_config("test", [*SETS, "max_steps=2"], 1, check_paths=False)).total_bytes
    assert sum(path.stat().st_size for path in written.iterdir()) == pytest.approx(planned, rel=0.05)

    # the oldest layout on 2 DDP processes (a branch of that run into a new folder, on another engine)
    result = launch(REPO_ROOT, 2, tmp_path / "ddp", 2, ["accelerate_config=ddp_cpu.yaml"],
                    resume=str(oldest / "checkpoints" / "checkpoint-1"))
    assert_resumed(result, oldest / "checkpoints" / "checkpoint-1", "2 processes ZeRO 2 -> 2 processes ZeRO 0")


@pytest.mark.slow
@needs_compiler
def test_a_checkpoint_file_that_would_run_code_is_refused_in_one_line(old_runs, tmp_path):
    """A pickle that calls os.system when loaded, planted as a checkpoint's file: the resume names the
    file and stops (exit 2) before anything is loaded, and the command never runs. The previous
    release's random states (NumPy arrays) load as data; the planted file does not."""

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)

    run_dir = tmp_path / "run"
    shutil.copytree(old_runs["plain"], run_dir, ignore=shutil.ignore_patterns("checkpoint-2"))
    checkpoint = run_dir / "checkpoints" / "checkpoint-1"
    assert load_file(checkpoint / "random_states_0.pkl")["numpy_random_seed"][0] == "MT19937"
    planted = checkpoint / "progress_state.pt"
    torch.save({"step": 1, "micro_step": 1, "note": RunsCode()}, planted)
    with pytest.raises(CheckpointFileError, match=f"^{planted}: refused: it names posix.system"):
        load_file(planted)
    result = launch(REPO_ROOT, 1, run_dir, 2, resume="latest")
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-3000:])
    refusal = [line for line in result.stderr.splitlines() if "refused" in line]
    assert len(refusal) == 1 and f"{planted}: refused: it names posix.system, which loading would import and run" in refusal[0], \
        result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "ran").exists()


def test_an_unfused_optimizer_state_resumes_into_the_fused_step():
    """Seraena's AdamW as earlier versions built it (unfused: its param groups say fused=None) loads into
    today's fused one with its moments and step counts, and takes today's settings: the step that
    passes found_inf runs (torch's load_state_dict would restore fused=None, and the unfused AdamW
    refuses found_inf: "Expected grad_scale and found_inf to be None")."""
    from models.seraena import Seraena

    torch.manual_seed(0)
    real, fake, context = torch.rand(2, 9, 16, 16), torch.rand(2, 9, 16, 16), torch.randn(2, 4, 2, 2)
    old = Seraena(9, 4, weight_seed=0)
    old.optimizer = torch.optim.AdamW(old.disc.parameters(), lr=3e-4, betas=(0.9, 0.99))  # as before 1ba285d
    for param in old.disc.parameters():
        param.grad = torch.randn_like(param)
    old.optimizer.step()
    saved = old.training_state_dict()
    assert saved["optimizer"]["param_groups"][0]["fused"] is None
    new = Seraena(9, 4, weight_seed=0)
    new.load_training_state_dict(saved)
    group = new.optimizer.param_groups[0]
    assert group["fused"] is True and group["foreach"] is None and group["betas"] == (0.9, 0.99)
    for param, old_param in zip(new.disc.parameters(), old.disc.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(new.optimizer.state[param][key], old.optimizer.state[old_param][key])
    new.discriminator_step(real, fake, context)  # passes found_inf to the fused AdamW
    assert all(float(new.optimizer.state[param]["step"]) == 2 for param in new.disc.parameters())
