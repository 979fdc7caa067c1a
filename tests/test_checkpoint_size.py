"""Checkpoints at scale (issue: 64 GPUs): what one checkpoint and the kept set weigh, the replay
buffers left out by a setting whose cost is said on resume, and a slow write that does not look
like a dead rank to the others."""

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, free_port

from training.config.load import load_config
from training.plan.memory import estimate_memory


def test_the_estimate_gives_one_checkpoint_and_the_kept_set_and_names_the_replay_buffers():
    config = load_config("64gpu_h100", [], 64, check_paths=False)
    with_buffers = estimate_memory(config)
    line = with_buffers.lines(None)[2]
    assert with_buffers.checkpoint_replay_gb == pytest.approx(with_buffers.host["replay buffer"] * 64)
    assert f"{with_buffers.checkpoint_gb * config.checkpoints_total_limit:.2f} GB for the {config.checkpoints_total_limit} kept" in line
    assert "seraena_buffer_in_checkpoints=false" in line
    without = estimate_memory(load_config("64gpu_h100", ["seraena_buffer_in_checkpoints=false"], 64, check_paths=False))
    assert without.checkpoint_gb == pytest.approx(with_buffers.checkpoint_gb - with_buffers.checkpoint_replay_gb)
    assert without.checkpoint_gb < 1 and "seraena_buffer_in_checkpoints" not in without.lines(None)[2]


@pytest.fixture(scope="module")
def synthetic_clips(tmp_path_factory):
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("synthetic")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


def launch(run_dir, sets, env_extra=None, processes="2", resume=None):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port()), **(env_extra or {})}
    args = [str(REPO_ROOT / "train_taehv_h100.sh"), processes, "test", "--output-dir", str(run_dir)]
    args += ["--resume", resume] if resume else []
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_a_slow_checkpoint_write_is_waited_for_and_the_buffer_can_be_left_out(tmp_path, synthetic_clips):
    """Rank 1's checkpoint write takes 12 s more, past step_timeout_s=6: the others wait in the
    save's collectives under nccl_timeout_s, and the run finishes. With the replay buffers left out,
    the rank files hold only the random state and the resume says the buffer refills."""
    run_dir = tmp_path / "run"
    sets = [f"data_root={synthetic_clips}", "seraena_weight=0.1", "batch_size_per_gpu=2", "step_timeout_s=6", "seraena_buffer_in_checkpoints=false",
            "max_steps=2", "checkpointing_steps=2"]  # one slow write
    first = launch(run_dir, sets, {"TAEHV_FAULT_SLOW_SAVE_S": "12", "TAEHV_FAULT_RANK": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    state = torch.load(run_dir / "checkpoints" / "checkpoint-2" / "seraena_rank1.pt", weights_only=False)
    assert "rng" in state and "buffer" not in state
    resumed = launch(run_dir, ["max_steps=4"], resume="latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(r"Seraena random state per rank \(the checkpoint holds no replay buffer: it refills", resumed.stdout), resumed.stdout[-3000:]
