"""Recipes users ask for (docs/howto/finetune.md#stages): decoder-only (or encoder-only) fine-tuning
of a public weight file, with the frozen part exported bit-equal."""

import pytest
import torch

from models.taehv import TAEHV
from training.config.load import load_config
from training.config.schema import ConfigError
from training.loop.build import build_model
from training.step.losses import compute_losses
from training.step.optimizer import build_optimizer


@pytest.fixture(scope="module")
def public_weights(tmp_path_factory):
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("weights") / "taehv.pth"
    torch.save(TAEHV("taehv").state_dict(), path)
    return path


def test_a_frozen_encoder_gets_no_gradients_and_no_optimizer_state(public_weights):
    config = load_config("test", [f"pretrained_model_path={public_weights}", "train_encoder=false", "n_frames=8"])
    student = build_model(config)
    optimizer, _ = build_optimizer(config, student)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in student.taehv.decoder.parameters()}
    loss, _ = compute_losses(config, student, torch.rand(1, 8, 3, 32, 32), None, None)
    loss.backward()
    assert all(p.grad is None for p in student.taehv.encoder.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.taehv.decoder.parameters())
    optimizer.step()
    assert set(optimizer.state) <= {p for p in student.taehv.decoder.parameters()}


def test_freezing_everything_or_random_weights_is_refused(public_weights):
    with pytest.raises(ConfigError, match="train_encoder=false and train_decoder=false: nothing would train"):
        load_config("test", [f"pretrained_model_path={public_weights}", "train_encoder=false", "train_decoder=false"])
    with pytest.raises(ConfigError, match="train_decoder=false with pretrained_model_path='' would freeze randomly"):
        load_config("test", ["train_decoder=false"])

# The decoder-only fine-tune under bf16 ZeRO-2 through the launcher (the frozen encoder exported
# bit-equal) shares the 2-process run of test_launchers::test_production_and_ddp_files_train_with_two_cpu_processes.


def test_scale_augmentation_zooms_between_the_minimum_side_and_the_whole_frame():
    from training.data.decode import zoomed_cover

    # a 64x96 frame, 32x32 training crops: the largest square region has a 64 px side
    assert zoomed_cover(64, 96, 0, (32, 32), 0.0, 16) == (128, 128)  # a 16 px region, scaled up 2x
    assert zoomed_cover(64, 96, 0, (32, 32), 1.0, 16) == (32, 32)  # the whole 64 px region, as without augmentation
    assert zoomed_cover(64, 96, 0, (32, 32), 0.5, 16) == (52, 52)  # a 40 px region
    assert zoomed_cover(96, 64, 90, (32, 32), 0.0, 16) == (128, 128)  # stored rotated: the shown frame decides
    assert zoomed_cover(64, 96, 0, (32, 32), 0.3, 100) == (32, 32)  # the frame is smaller than the minimum: no zoom


def test_scale_augmented_training_clips_keep_their_size_and_differ_from_plain_crops(tmp_path):
    from training.data.synthetic_clips import make_sample_videos
    from training.data.clips import ClipSpec, VideoClipDataset
    from training.data.index import read_index

    make_sample_videos(tmp_path / "clips", count=2, n_frames=16)
    index = read_index(tmp_path / "clips", tmp_path / "clips")
    plain = VideoClipDataset(index, ClipSpec(8, 32, 32), train=True, seed=0)
    zoomed = VideoClipDataset(index, ClipSpec(8, 32, 32, crop_min_side=16), train=True, seed=0)
    validation = VideoClipDataset(index, ClipSpec(8, 32, 32, crop_min_side=16), train=False, seed=0)
    for key in [(0, 0), (1, 0), (0, 1)]:
        a, b = plain[key]["video"], zoomed[key]["video"]
        assert a.shape == b.shape == (8, 3, 32, 32) and not torch.equal(a, b)
    # validation clips are never augmented: the same as a plain crop
    plain_validation = VideoClipDataset(index, ClipSpec(8, 32, 32), train=False, seed=0)
    assert torch.equal(validation[0]["video"], plain_validation[0]["video"])


def test_scale_augmentation_crops_first_and_shows_the_pixels_of_scaling_the_whole_frame():
    """zoomed_crop cuts the region out of the original frame and scales only it; the result is the
    crop of the whole frame scaled to the zoomed size (what the loader did before), pixel for pixel
    up to rounding, at every zoom and position drawn."""
    import random

    import torch.nn.functional as F

    from training.data.decode import cover_size, zoomed_cover, zoomed_crop

    generator = torch.Generator().manual_seed(0)
    smooth = F.interpolate(torch.rand(2, 3, 27, 48, generator=generator), size=(216, 384), mode="bicubic", align_corners=False)
    video = (smooth.clamp(0, 1) * 255).round().to(torch.uint8)  # a 216x384 frame with detail at several scales
    for seed in range(12):
        u = random.Random(seed).random()
        crop, (top, left) = zoomed_crop(video, 48, 72, u, 16, random.Random(seed))
        size = cover_size(216, 384, *zoomed_cover(216, 384, 0, (48, 72), u, 16))
        whole = F.interpolate(video.float(), size=size, mode="bilinear", antialias=True, align_corners=False)
        expected = whole[..., top : top + 48, left : left + 72].round().clamp(0, 255)
        assert crop.shape == (2, 3, 48, 72)
        assert (crop.float() - expected).abs().max() <= 1, (seed, u, size)  # rounding only


def test_a_staged_run_interrupted_in_stage_two_resumes_there(public_weights, tmp_path):
    """Stage 1 at 32x32, stage 2 at 48x48, the encoder frozen in both; a stop during stage 2, then
    the printed command (the user's own options again): stage 1 is not run again, stage 2 continues
    from its checkpoint."""
    import json
    import os
    import re
    import shlex
    import subprocess
    import sys

    from conftest import REPO_ROOT, free_port

    from training.data.synthetic_clips import make_sample_videos

    make_sample_videos(tmp_path / "clips", count=4, n_frames=16)
    config = tmp_path / "staged.py"
    config.write_text(f'''base_profile = "test"
overrides = dict(
    pretrained_model_path={str(public_weights)!r},
    data_root={str(tmp_path / "clips")!r},
    n_frames=8,
    stages=(dict(name="low", steps=1, height=32, width=32, train_encoder=False),
            dict(name="high", steps=3, height=48, width=48, train_encoder=False, learning_rate=1e-3)),
)
''')
    run_dir = tmp_path / "run"
    command = [str(REPO_ROOT / "train_taehv_h100.sh"), "1", "custom", str(config), "--output-dir", str(run_dir)]

    def launch(command, extra_env):
        env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port()), **extra_env}
        return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)

    # stage 1 has 1 step; stage 2 stops during its step 2; a --set applies to every stage
    first = launch(command + ["--set", "seed=7"], {"TAEHV_FAULT_STOP_AT_STEP": "2"})
    assert first.returncode == 143, first.stderr[-3000:]  # stopped by a signal before the last stage ended
    printed = re.search(r"stopped in stage 2 \(high\); continue the staged run with: (.*)", first.stdout)
    assert printed, first.stdout[-3000:]
    assert shlex.split(printed.group(1)) == command + ["--set", "seed=7"]  # the user's options, repeated
    assert (run_dir / "stage1-low" / "FINISHED").exists() and not (run_dir / "final").exists()
    second = launch(shlex.split(printed.group(1)), {})
    assert second.returncode == 0, second.stderr[-3000:]
    assert "stage 1 (low): finished earlier" in second.stdout and "at step 2" in second.stdout
    assert "Step 3/3" in second.stdout and "all 2 stages done" in second.stdout
    stage2 = json.loads((run_dir / "stage2-high" / "resolved_config.json").read_text())
    assert (stage2["height"], stage2["learning_rate"], stage2["stage"], stage2["seed"]) == (48, 1e-3, 2, 7)
    assert stage2["pretrained_model_path"] == str(run_dir / "stage1-low" / "final")  # the folder: its <variant>.pth
    exported = torch.load(run_dir / "final" / "taehv.pth", weights_only=True)  # the last stage's export
    public = torch.load(public_weights, weights_only=True)
    assert all(torch.equal(exported[k], public[k]) for k in public if k.startswith("encoder."))


@pytest.mark.parametrize("schedule", ["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts",
                                      "polynomial"])
def test_optimizer_takes_the_configured_betas_and_each_schedule_has_diffusers_shape(schedule):
    """Configs written for the original scripts name diffusers' schedules: same name, same curve."""
    from diffusers.optimization import get_scheduler

    config = load_config("test", [f"lr_scheduler={schedule}", "warmup_steps=3", "max_steps=10", "adam_beta2=0.97",
                                  "learning_rate=0.002"])
    optimizer, ours = build_optimizer(config, build_model(config))
    assert optimizer.param_groups[0]["betas"] == (config.adam_beta1, 0.97)
    theirs_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.002)
    theirs = get_scheduler(schedule, theirs_optimizer, num_warmup_steps=3, num_training_steps=10)
    for _ in range(12):
        assert ours.get_last_lr()[0] == pytest.approx(theirs.get_last_lr()[0], rel=1e-9, abs=1e-15)
        optimizer.step(), ours.step(), theirs_optimizer.step(), theirs.step()


def test_an_unknown_schedule_is_refused_with_the_names():
    with pytest.raises(ConfigError, match="lr_scheduler='cosine_annealing': choose one of constant, constant_with_warmup"):
        load_config("test", ["lr_scheduler=cosine_annealing"])


@pytest.mark.parametrize("schedule", ["cosine", "polynomial"])
def test_a_resume_with_a_lower_learning_rate_goes_on_at_its_step_with_the_new_peak(schedule):
    """The schedule's saved state holds the peak it was built with; after a resume that lowers
    learning_rate (training/step/optimizer.py set_peak_learning_rate) the rate at each later step is
    what a run built with that peak has at the same step."""
    from training.step.optimizer import set_peak_learning_rate

    sets = [f"lr_scheduler={schedule}", "warmup_steps=3", "max_steps=10"]
    first = load_config("test", sets + ["learning_rate=1e-3"])
    optimizer, scheduler = build_optimizer(first, torch.nn.Linear(2, 2))
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    lowered = load_config("test", sets + ["learning_rate=2e-4"])
    optimizer, resumed = build_optimizer(lowered, torch.nn.Linear(2, 2))
    resumed.load_state_dict(scheduler.state_dict())  # what a resume restores
    set_peak_learning_rate(resumed, lowered.learning_rate)
    reference_optimizer, reference = build_optimizer(lowered, torch.nn.Linear(2, 2))
    for _ in range(5):
        reference_optimizer.step()
        reference.step()
    for _ in range(3):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(reference_optimizer.param_groups[0]["lr"], rel=1e-12)
        assert resumed.get_last_lr() == pytest.approx(reference.get_last_lr(), rel=1e-12)
        for opt, sched in ((optimizer, resumed), (reference_optimizer, reference)):
            opt.step()
            sched.step()
