"""Checkpoint and export writes that fail: on a real full disk (a small tmpfs mounted for the test,
where torch.save raises a RuntimeError that names no errno and safetensors its own error), by a
failed rename, by an OSError. Each is one line and a failed checkpoint, never a dead run; the
temporary folder goes and the last complete checkpoint stays the one a resume takes. The mounts
need root (and a kernel that lets it mount): elsewhere those tests skip."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO_ROOT, free_port

from training.base.run_log import RunLog
from training.config.load import load_config
from training.data.clips import FailureTracker
from training.loop.checkpoints import save_checkpoint
from training.loop.state import TrainingRun
from training.run.checkpoint_files import complete_checkpoints
from training.run.elastic import state_fingerprint
from training.run.folder import find_resume_checkpoint


@pytest.fixture
def small_disk():
    """mount(folder, size): a tmpfs of `size` at `folder` (created), unmounted at teardown."""
    mounted = []

    def mount(folder: Path, size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        folder.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


class OneProcess:
    """What the save reads of accelerate's Accelerator in a one-process run without DeepSpeed."""

    num_processes, process_index, is_main_process = 1, 0, True
    device, step, scaler = torch.device("cpu"), 0, None
    state = SimpleNamespace(deepspeed_plugin=None)

    def wait_for_everyone(self) -> None:
        pass


def small_run(run_dir: Path, features: int = 256) -> TrainingRun:
    """A run whose checkpoint is one small linear layer (3 x 256 KB of full state) with its AdamW moments."""
    from training.base.lr_schedule import build_lr_scheduler

    run_dir.mkdir(parents=True, exist_ok=True)
    config = load_config("test", ["checkpoints_total_limit=1"], 1, check_paths=False)
    model = torch.nn.Linear(features, features, bias=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, features)).square().mean().backward()
    optimizer.step()
    return TrainingRun(config=config, run_dir=run_dir, accelerator=OneProcess(), model=model, optimizer=optimizer,
                       scheduler=build_lr_scheduler(optimizer, "constant", 0, 10), ema=None, seraena=None,
                       reference_vae=None, lpips=None, loader=None, sampler=None, validation_dataset=None,
                       failures=FailureTracker(0.1), log=RunLog(run_dir, True))


def assert_complete(folder: Path) -> None:
    """The checkpoint's full state is whole: its fingerprint is the one recorded beside it."""
    saved = json.loads((folder / "topology.json").read_text())
    assert state_fingerprint(torch.load(folder / "full_state.pt", weights_only=True)) == saved["state_fingerprint"]


def test_a_full_disk_fails_the_checkpoint_and_keeps_the_last_complete_one(tmp_path, small_disk, capsys):
    """Room for one checkpoint: the second's full_state.pt meets the full disk (torch.save's RuntimeError,
    "unexpected pos"), which is a failed checkpoint in one line; the first stays the latest."""
    run = small_run(tmp_path / "run")
    small_disk(tmp_path / "run" / "checkpoints", "1200k")
    assert save_checkpoint(run, 1) == tmp_path / "run" / "checkpoints" / "checkpoint-1"
    assert save_checkpoint(run, 2) is None
    line = next(line for line in capsys.readouterr().out.splitlines() if "FAILED" in line)
    assert re.search(r"checkpoint at step 2 FAILED on rank 0 \(writing \S+/\.tmp-checkpoint-2/full_state\.pt: "
                     r"\[enforce fail at inline_container\.cc:\d+\] \. unexpected pos \d+ vs \d+; 0\.\d MB free there\); "
                     r"kept checkpoint-1; training continues", line), line
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["checkpoint-1"]
    assert find_resume_checkpoint("latest", tmp_path / "run").name == "checkpoint-1"
    assert_complete(tmp_path / "run" / "checkpoints" / "checkpoint-1")
    assert run.failed_checkpoints == 1


def test_a_failed_rename_is_a_failed_checkpoint_and_a_saved_step_keeps_its_folder(tmp_path, monkeypatch, capsys):
    """The rename into place fails (a lost mount, an I/O error): the complete temporary folder goes and
    the last checkpoint stays; saving a step that already has its folder (a resumed run at its last
    step) keeps that folder when the rename fails. Then a save succeeds and rotates the old one out."""
    run = small_run(tmp_path / "run")
    checkpoints = tmp_path / "run" / "checkpoints"
    assert save_checkpoint(run, 1) is not None
    rename = Path.rename

    def failing(self, target):  # the complete temporary folder cannot be moved into place
        if self.name.startswith(".tmp-checkpoint-"):
            raise OSError(5, "Input/output error", str(target))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", failing)
    for step in (2, 1):
        assert save_checkpoint(run, step) is None
        assert f"checkpoint at step {step} FAILED on rank 0 ([Errno 5] Input/output error: " in capsys.readouterr().out
        assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-1"]
        assert_complete(checkpoints / "checkpoint-1")
    assert run.failed_checkpoints == 2
    monkeypatch.undo()  # the mount is back: the next checkpoint is written and the older one rotated out
    assert save_checkpoint(run, 3) is not None
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-3"]
    assert_complete(checkpoints / "checkpoint-3")


def test_an_export_to_a_full_disk_is_an_oserror_and_the_previous_export_stays(tmp_path, small_disk):
    """torch.save's RuntimeError and safetensors' SafetensorError on a full disk reach the callers
    (validation's best_model/, the final export) as the OSError they handle."""
    from models.taehv import TAEHV
    from training.loop.exports import export_model

    folder = small_disk(tmp_path / "disk", "1m") / "final"
    folder.mkdir()
    (folder / "taehv.pth").write_bytes(b"the previous export")
    taehv = TAEHV("taehv")
    with pytest.raises(OSError, match=r"writing \S+/\.tmp-final: .*; 0\.\d MB free there"):
        export_model(OneProcess(), taehv.state_dict(), taehv, folder, 3, {})
    assert sorted(p.name for p in folder.parent.iterdir()) == ["final"]  # the temporary folder went
    assert (folder / "taehv.pth").read_bytes() == b"the previous export"


@pytest.mark.slow
def test_two_processes_train_on_past_a_full_checkpoint_disk(tmp_path, small_disk):
    """The real launcher, 2 DDP processes, checkpoints on a tmpfs with room for one: checkpoint-1 is
    written; the temporary folder of checkpoint-2 fills the disk on rank 0 (the full state) while rank
    1's own file may fit; both ranks agree it failed, the run trains on to step 3 and exports;
    checkpoint-1 stays whole and is what --resume latest takes."""
    from training.data.synthetic_clips import make_sample_videos

    clips = tmp_path / "clips"
    make_sample_videos(clips, count=6, n_frames=24)
    run_dir = tmp_path / "run"
    small_disk(run_dir / "checkpoints", "250m")  # one checkpoint of the test profile is 181 MB
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    result = subprocess.run([str(REPO_ROOT / "train_taehv_h100.sh"), "2", "test", "--output-dir", str(run_dir), "--max-steps", "3",
                             "--set", f"data_root={clips}", "--set", "checkpointing_steps=1", "--set", "checkpoints_total_limit=1"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Step 3/3" in result.stdout and "checkpoint " + str(run_dir / "checkpoints" / "checkpoint-1") in result.stdout
    failed = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert len(failed) == 2 and all(re.search(r"checkpoint at step \d FAILED on ranks? 0.*full_state\.pt: \[enforce fail at "
                                              r"inline_container\.cc.*MB free there.*; kept checkpoint-1; training continues", line)
                                    for line in failed), failed
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-1"]
    assert complete_checkpoints(run_dir)[-1] == find_resume_checkpoint("latest", run_dir) == run_dir / "checkpoints" / "checkpoint-1"
    assert_complete(run_dir / "checkpoints" / "checkpoint-1")
    assert (run_dir / "final" / "model_info.json").is_file()
