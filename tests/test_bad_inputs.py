"""Rows of the bad-input matrix (docs/reliability.md) not covered where their room is tested:
each gets one line naming the thing and the fix, before any heavy work, and nothing the user had
is changed. The other rows live in test_config, test_launchers, test_dataset, test_taehv,
test_training and test_latent_cache (the matrix says where)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, free_port

from training.loop.train import main as train_main


def launch(args, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    return subprocess.run([str(REPO_ROOT / "train_taehv_h100.sh"), *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def folder_digest(folder):
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def fake_checkpoint(run_dir, step=2, **contract):
    folder = run_dir / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    topology = {"num_processes": 1, "zero_stage": 0, "batch_size_per_gpu": 1, "micro_step": step,
                "state_fingerprint": "0", "model_variant": "taehv", "registered": ["scheduler", "progress", "ema"], **contract}
    (folder / "topology.json").write_text(json.dumps(topology))
    (folder / "full_state.pt").write_bytes(b"weights the user wants to keep")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("processes", ["1", "2"])
def test_empty_data_folder_is_one_line_exit_3_and_writes_no_run_folder(tmp_path, processes):
    """The training's own line and exit code reach the terminal, not accelerate's or torchrun's
    report (training/base/launch.py); a start that fails its inputs creates no run folder."""
    (tmp_path / "empty").mkdir()
    run_dir = tmp_path / "run"
    result = launch([processes, "test", "--output-dir", str(run_dir), "--set", f"data_root={tmp_path / 'empty'}"], tmp_path)
    assert result.returncode == 3, result.stderr[-3000:]
    assert result.stderr.strip() == f"data error: no video files under {tmp_path / 'empty'}: check data_root / index_path"
    assert not run_dir.exists()


def test_a_folder_of_fewer_than_two_clips_is_named_by_the_dry_run_and_stops_the_launch(tmp_path):
    """One clip would leave the training or the validation split empty: the dry run names the folder
    (exit 1, as for any missing input), and the launch stops with exit 3 and the real cause,
    writing no run folder."""
    from training.data.synthetic_clips import make_sample_videos

    clips = tmp_path / "clips"
    make_sample_videos(clips, count=1, n_frames=12)
    (tmp_path / "empty").mkdir()
    one_clip = (f"only 1 video file under {clips}: a run needs at least 2 (one is held out for validation); add clips, "
                "or check data_root / index_path")
    for folder, line in [(tmp_path / "empty", f"no video files under {tmp_path / 'empty'}: check data_root / index_path"),
                         (clips, one_clip)]:
        dry = launch(["1", "test", "--dry-run", "--set", f"data_root={folder}"], tmp_path)
        assert dry.returncode == 1 and f"  missing: {line}" in dry.stdout, dry.stdout[-2000:]
    # the launch on the empty folder is test_empty_data_folder_is_one_line_exit_3_and_writes_no_run_folder's
    run_dir = tmp_path / "run"
    result = launch(["1", "test", "--output-dir", str(run_dir), "--set", f"data_root={clips}"], tmp_path)
    assert (result.returncode, result.stderr.strip()) == (3, f"data error: {one_clip}")
    assert not run_dir.exists()


def test_resume_latest_without_a_checkpoint_is_one_line_exit_2(tmp_path):
    result = launch(["1", "test", "--output-dir", str(tmp_path / "run"), "--resume", "latest"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"resume error: --resume latest: no complete checkpoint in {tmp_path / 'run' / 'checkpoints'}: "
                                     "start it without --resume, or use --resume auto")
    assert not (tmp_path / "run").exists()


def test_a_crash_the_training_did_not_explain_names_the_rank_and_keeps_torchruns_report(tmp_path):
    """A rank killed by a signal (the OOM killer, a segfault) has no line of its own: the launcher
    says which rank and keeps torchrun's report in the run folder's launch.log."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "crash.py"
    script.write_text("import os, signal, sys\nfrom pathlib import Path\n"
                      "Path(sys.argv[2], 'train.log').write_text('started\\n')\n"
                      "if os.environ['RANK'] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    code = subprocess.run([sys.executable, "-m", "training.base.launch", "--config_file", str(REPO_ROOT / "accelerate_configs" / "ddp_cpu.yaml"),
                           "--num_processes", "2", "--main_process_port", str(free_port()), str(script), "--output-dir", str(run_dir)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert code.returncode == 128 + 9, code.stderr[-3000:]
    assert code.stderr.strip().splitlines()[-1] == f"training failed: rank 1 was killed by SIGKILL; the launcher's report is in {run_dir / 'launch.log'}"
    report = (run_dir / "launch.log").read_text()
    assert "Traceback" not in code.stderr and "Root Cause" in report and "Signal 9 (SIGKILL) received" in report


def test_output_folder_that_cannot_be_written_is_named(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    code = train_main(["--config", "test", "--output-dir", str(blocker / "run")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and error.count("\n") == 0
    assert f"output_dir='{blocker / 'run'}' cannot be written (Not a directory): choose another --output-dir" in error


def test_fresh_start_on_a_run_folder_with_checkpoints_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    fake_checkpoint(run_dir)
    (run_dir / "train.log").write_text("the earlier run's log\n")
    before = folder_digest(run_dir)
    result = launch(["1", "test", "--output-dir", str(run_dir)], tmp_path)
    assert result.returncode != 0
    assert f"{run_dir} already holds checkpoint-2: continue it with --resume latest, or choose another --output-dir" in result.stderr
    assert folder_digest(run_dir) == before


@pytest.mark.parametrize("contract, message", [
    ({"model_variant": "taecvx"}, "holds a 'taecvx' student but this run has model_variant='taehv': resume with --set model_variant=taecvx"),
    ({"registered": ["scheduler", "progress", "ema", "seraena"]},
     "was written with scheduler, progress, ema, seraena but this run has scheduler, progress, ema: keep ema_decay and seraena_weight"),
])
def test_checkpoint_from_a_different_config_is_refused_before_any_work(contract, message, tmp_path, capsys):
    run_dir = tmp_path / "run"
    fake_checkpoint(run_dir, **contract)
    before = folder_digest(run_dir)
    code = train_main(["--config", "test", "--output-dir", str(run_dir), "--resume", "latest"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and message in error and error.count("\n") == 0
    assert folder_digest(run_dir) == before


def test_a_folder_that_is_not_our_checkpoint_is_refused(tmp_path, capsys):
    other = tmp_path / "downloaded_checkpoint"
    other.mkdir()
    code = train_main(["--config", "test", "--output-dir", str(tmp_path / "run"), "--resume", str(other)])
    assert code == 2 and "is not a checkpoint written by this trainer (no topology.json)" in capsys.readouterr().err
