"""A run is its run folder (training/run/folder.py): a resume of a recorded run restores its
settings, lets a resume change only what RESUME_MAY_CHANGE lists (each change recorded, the
previous resolved config kept), refuses the rest in one line, and a quick trial (--max-steps)
caps every interval. The launcher-level check (SIGTERM, then the printed continue command) is
tests/test_launchers.py::test_ctrl_c_checkpoints_and_the_printed_command_continues_the_same_run."""

import json
import os
from pathlib import Path

import pytest

from training.config.load import available_profiles, load_config, profile_overrides
from training.config.schema import ConfigError, ResumeError
from training.run.folder import RESUME_MAY_CHANGE, load_run, record_run


def start(run_dir, overrides, profile="test", processes=1):
    """A fresh launch recorded as rank 0 records it, plus one complete checkpoint to resume."""
    run = load_run(profile, overrides, processes, output_dir=str(run_dir), check_paths=False)
    record_run(run)
    (run_dir / "checkpoints" / "checkpoint-5").mkdir(parents=True)
    return run


def resume(run_dir, overrides=(), profile="test", processes=1, how="latest"):
    return load_run(profile, list(overrides), processes, output_dir=str(run_dir), resume=how, check_paths=False)


def test_the_continue_command_restores_the_runs_own_settings_and_rewrites_nothing(tmp_path):
    run_dir = tmp_path / "run"
    start(run_dir, ["max_steps=40", "learning_rate=3e-4", "checkpointing_steps=5", "data_root=/data/clips"])
    before = (run_dir / "resolved_config.json").read_bytes()
    again = resume(run_dir)  # exactly what the launcher prints: profile, --output-dir, --resume latest
    assert again.restored and again.changes == []
    assert (again.config.max_steps, again.config.learning_rate, again.config.data_root) == (40, 3e-4, "/data/clips")
    assert str(again.resume_from).endswith("checkpoint-5")
    record_run(again)
    assert (run_dir / "resolved_config.json").read_bytes() == before
    assert sorted(p.name for p in run_dir.glob("resolved_config*")) == ["resolved_config.json"]
    # repeating the run's own --set values is no change either
    assert resume(run_dir, ["learning_rate=3e-4", "max_steps=40"]).changes == []


def test_a_resume_may_extend_the_run_and_the_change_is_recorded_with_history(tmp_path):
    run_dir = tmp_path / "run"
    start(run_dir, ["max_steps=40", "learning_rate=3e-4"])
    extended = resume(run_dir, ["max_steps=60", "num_workers=2"])
    assert extended.change_lines() == ["resume changes num_workers: 0 -> 2", "resume changes max_steps: 40 -> 60"]
    assert extended.config.learning_rate == 3e-4
    record_run(extended)
    assert json.loads((run_dir / "resolved_config.json").read_text())["max_steps"] == 60
    assert json.loads((run_dir / "resolved_config.until-step-5.json").read_text())["max_steps"] == 40
    # the next continue command keeps the extension
    assert resume(run_dir).config.max_steps == 60 and resume(run_dir).changes == []


@pytest.mark.parametrize("override, key", [("perceptual_weight=0.5", "perceptual_weight"), ("data_root=/elsewhere", "data_root"),
                                           ("n_frames=12", "n_frames")])
def test_any_other_change_on_resume_is_refused_in_one_line_naming_both_values(tmp_path, override, key):
    run_dir = tmp_path / "run"
    start(run_dir, ["max_steps=40", "learning_rate=3e-4", "data_root=/data/clips"])
    with pytest.raises(ResumeError) as refused:
        resume(run_dir, [override])
    message = str(refused.value)
    assert "\n" not in message and key not in RESUME_MAY_CHANGE
    recorded = json.loads((run_dir / "resolved_config.json").read_text())[key]
    assert f"--set {override.split('=')[0]}=" in message and f"the run's {key}={recorded!r}" in message
    assert f"--resume {run_dir / 'checkpoints' / 'checkpoint-5'} --output-dir <new folder>" in message


def test_another_process_count_takes_the_profiles_topology_and_keeps_the_runs_training_settings(tmp_path):
    run_dir = tmp_path / "run"
    start(run_dir, ["learning_rate=3e-4"], profile="cpu", processes=2)
    one = resume(run_dir, profile="cpu", processes=1)
    per_process = one.config.batch_size_per_gpu  # the profile's, one accumulation step
    assert one.config.global_batch_size == per_process and one.config.learning_rate == 3e-4
    assert ("global_batch_size", 2 * per_process, per_process) in one.changes
    assert {key for key, _, _ in one.changes} <= RESUME_MAY_CHANGE


def test_resume_latest_without_a_checkpoint_and_no_run_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(ResumeError, match=r"^--resume latest: no complete checkpoint in .*: start it without --resume"):
        resume(tmp_path / "empty")
    assert resume(tmp_path / "fresh", how="auto").resume_from is None  # auto: a fresh start
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ResumeError, match="needs output/latest: no earlier run found"):
        load_run("test", [], 1, resume="latest", check_paths=False)


def test_only_default_run_folders_move_output_latest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record_run(load_run("test", [], 1, check_paths=False))  # output/<timestamp>
    default = (tmp_path / "output" / "latest").resolve()
    record_run(load_run("test", [], 1, output_dir="output/mine", check_paths=False))
    assert (tmp_path / "output" / "latest").resolve() == default != (tmp_path / "output" / "mine").resolve()


@pytest.mark.parametrize("profile", available_profiles())
def test_max_steps_is_a_quick_trial_of_every_profile(profile):
    processes = (profile_overrides(profile)[0].get("supported_num_gpus") or (8,))[0]
    notes = []
    config = load_config(profile, ["max_steps=20"], processes, check_paths=False, notes=notes)
    for key in ("warmup_steps", "log_every", "validation_steps", "checkpointing_steps"):
        assert getattr(config, key) <= 20
    assert len(notes) <= 1 and all(note.startswith("quick trial: max_steps=20 caps ") for note in notes)


def test_max_steps_is_a_quick_trial_of_the_staged_recipe_in_the_docs(tmp_path):
    recipe = tmp_path / "my_decoder_finetune.py"
    recipe.write_text('base_profile = "h100"\noverrides = dict(\n    pretrained_model_path="checkpoints/taecvx.pth",\n'
                      '    stages=(\n        dict(name="low", steps=20_000, height=240, width=360, train_encoder=False, '
                      'batch_size_per_gpu=16,\n             gradient_accumulation_steps=1),\n'
                      '        dict(name="high", steps=10_000, height=480, width=720, train_encoder=False, learning_rate=5e-5),\n'
                      '    ),\n)\n')
    for stage in (1, 2):
        config = load_config(str(recipe), [f"stage={stage}", "max_steps=20"], 8, check_paths=False)
        assert config.max_steps == 20 and config.warmup_steps == 20
    # a config file's own max_steps below its warm-up is still a mistake to fix, not a quick trial
    mistake = tmp_path / "mistake.py"
    mistake.write_text('base_profile = "h100"\noverrides = dict(max_steps=20)\n')
    with pytest.raises(ConfigError, match="warmup_steps=2000 exceeds max_steps=20"):
        load_config(str(mistake), [], 8, check_paths=False)


def test_a_killed_trainings_forked_children_do_not_hold_the_run_folder(tmp_path):
    """Data-loader workers are forked from rank 0 and outlive a SIGKILL of it by seconds: the run
    folder must be free as soon as the rank itself is gone, or the relaunch is refused."""
    import signal
    import subprocess
    import sys
    import time

    from training.run.folder import lock_run_folder, run_folder_holder

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from pathlib import Path
from training.run.folder import lock_run_folder
lock_run_folder(Path({str(run_dir)!r}))
child = os.fork()
if child == 0:  # a data worker: it keeps every descriptor its parent had
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    child = int(holder.stdout.readline())
    try:
        assert run_folder_holder(run_dir).startswith(f"process {holder.pid} on ")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        time.sleep(0.2)
        assert Path(f"/proc/{child}").exists()  # the worker is still there
        assert run_folder_holder(run_dir) == ""
        lock_run_folder(run_dir)  # the relaunch's rank 0 takes it
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_training_of_an_older_version_holding_the_folder_with_flock_is_seen(tmp_path):
    """Record locks and flock locks ignore each other on Linux: a run started before the lock became
    a record lock still refuses a second training on its folder."""
    import fcntl

    from training.run.folder import run_folder_holder

    (tmp_path / ".lock").write_text("process 1 on an-older-version\n")
    with open(tmp_path / ".lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        pid = os.fork()
        if pid == 0:  # another process: flock conflicts only across open file descriptions
            os._exit(0 if run_folder_holder(tmp_path) == "process 1 on an-older-version" else 1)
        assert os.waitpid(pid, 0)[1] == 0


def test_a_holder_that_ends_within_the_wait_lets_the_relaunch_start(tmp_path, capsys):
    """A job scheduler relaunches at once after a kill, while the killed rank may still be exiting:
    the first step waits a bounded time for the holder, says so, and goes on when it lets go."""
    import subprocess
    import sys
    import time

    from training.run.folder import check_not_in_use

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from pathlib import Path
from training.run.folder import lock_run_folder
lock_run_folder(Path({str(run_dir)!r}))
print("locked", flush=True)
time.sleep(2)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "locked\n"
    started = time.monotonic()
    check_not_in_use(run_dir, wait_s=20)  # returns once the holder exits, about 2 s later
    assert time.monotonic() - started < 15
    assert f"run folder {run_dir} is held by the training process {holder.pid} on " in capsys.readouterr().err
    holder.wait()


def test_a_plain_resume_may_lower_the_learning_rate(tmp_path):
    """troubleshooting.md's fix for a loss gone non-finite, as written: --resume latest --set learning_rate=..."""
    run_dir = tmp_path / "run"
    start(run_dir, ["max_steps=40", "learning_rate=3e-4"])
    lowered = resume(run_dir, ["learning_rate=5e-5"])
    assert lowered.change_lines() == ["resume changes learning_rate: 0.0003 -> 5e-05"]
    assert lowered.config.learning_rate == 5e-5


def test_a_branch_continues_the_run_it_branches_changing_only_what_it_is_given(tmp_path):
    """--resume <checkpoint of run A> --output-dir B: B starts from A's recorded settings (its data,
    teacher and keys set on A's command line), not the profile's defaults; each key the branch gives is
    one 'branch changes' line, and B's own record says so for its own resumes."""
    source = tmp_path / "a"
    start(source, ["max_steps=40", "learning_rate=3e-4", "data_root=/data/clips", "perceptual_weight=0.2", "n_frames=12"])
    checkpoint = source / "checkpoints" / "checkpoint-5"
    branch_dir = tmp_path / "b"
    branch = load_run("test", ["learning_rate=5e-5", "data_root=/data/other"], 1, output_dir=str(branch_dir),
                      resume=str(checkpoint), check_paths=False)
    assert branch.change_lines() == ["branch changes data_root: '/data/clips' -> '/data/other'",
                                     "branch changes learning_rate: 0.0003 -> 5e-05"]
    assert (branch.config.perceptual_weight, branch.config.n_frames, branch.config.max_steps) == (0.2, 12, 40)
    assert branch.config.output_dir == str(branch_dir) and branch.resume_from == checkpoint
    record_run(branch)
    recorded = json.loads((branch_dir / "resolved_config.json").read_text())
    assert (recorded["learning_rate"], recorded["perceptual_weight"], recorded["output_dir"]) == (5e-5, 0.2, str(branch_dir))
    assert json.loads((branch_dir / "launch.json").read_text())["branch_of"] == str(checkpoint)
    assert json.loads((source / "resolved_config.json").read_text())["learning_rate"] == 3e-4  # the source is untouched
    (branch_dir / "checkpoints" / "checkpoint-6").mkdir(parents=True)
    again = resume(branch_dir)  # the branch's own continue command: its settings, no change
    assert again.changes == [] and (again.config.learning_rate, again.config.data_root) == (5e-5, "/data/other")


def test_a_branch_takes_the_settings_its_checkpoint_was_trained_with(tmp_path):
    """A run resumed at step 5 with a lower rate keeps the earlier settings as until-step-5: a branch
    from checkpoint-5 continues those, one from a later checkpoint the changed ones."""
    source = tmp_path / "a"
    start(source, ["max_steps=40", "learning_rate=3e-4"])
    record_run(resume(source, ["learning_rate=1e-4"]))  # at checkpoint-5: the rate lowered from here on
    (source / "checkpoints" / "checkpoint-8").mkdir()
    for step, rate in ((5, 3e-4), (8, 1e-4)):
        branch = load_run("test", [], 1, output_dir=str(tmp_path / f"b{step}"), resume=str(source / "checkpoints" / f"checkpoint-{step}"),
                          check_paths=False)
        assert branch.config.learning_rate == rate and branch.changes == []
