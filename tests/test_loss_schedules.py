"""Loss schedules, recipes and GAN safety (training/config/terms.py, recipes.py, training/step/):
a term's weight is a function of the optimizer step, so a resume in the middle of a ramp continues
it exactly; recipes are config deltas on any profile; a discriminator batch BatchNorm cannot
normalise is refused; a failing discriminator is reset."""

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT, free_port
from training.config.load import load_config
from training.config.recipes import RECIPES
from training.config.schema import ConfigError, TrainConfig
from training.config.terms import TERMS_BY_NAME, discriminator_updates, schedule_lines, term_weights, weight_at


def config_with(**values) -> TrainConfig:
    return dataclasses.replace(TrainConfig(), **values)


def test_a_weight_is_zero_before_its_start_then_ramps_linearly_then_stays():
    config = config_with(seraena_weight=0.2, seraena_schedule=(10, 4))
    seraena = TERMS_BY_NAME["seraena"]
    assert [weight_at(config, seraena, step) for step in (0, 9, 10, 11, 12, 13, 14, 1000)] == \
        pytest.approx([0, 0, 0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    # no ramp: on at its start; no schedule: the full weight from step 0
    assert weight_at(config_with(seraena_weight=0.2, seraena_schedule=(10, 0)), seraena, 10) == 0.2
    assert term_weights(config_with(), 0)["reconstruction"] == TrainConfig().reconstruction_weight
    # a later stage counts from the run's first step: its step 0 is the run's step 30
    staged = config_with(seraena_weight=0.2, seraena_schedule=(32, 4), schedule_offset=30)
    assert [weight_at(staged, seraena, step) for step in (0, 1, 2, 5)] == pytest.approx([0, 0, 0.05, 0.2])


def test_the_discriminator_starts_with_its_term_or_earlier_for_a_critic_warm_up():
    late = config_with(seraena_schedule=(100, 10))
    assert not discriminator_updates(late, 99) and discriminator_updates(late, 100)
    warm = config_with(seraena_schedule=(100, 10), discriminator_start_step=40)
    assert not discriminator_updates(warm, 39) and discriminator_updates(warm, 40)
    with pytest.raises(ConfigError, match=r"discriminator_start_step=200 is after the seraena term's start 100"):
        load_config("h100", ["seraena_schedule=100,10", "discriminator_start_step=200"], 8, check_paths=False)


@pytest.mark.parametrize("sets, message", [
    (["seraena_schedule=1,2,3"], r"seraena_schedule=\(1, 2, 3\): expected \(start_step, ramp_steps\)"),
    (["seraena_schedule=x"], r"--set seraena_schedule=x: expected start_step,ramp_steps"),
    # the only term that reads the reference decode starts late: the decoder would sit idle at first
    (["decoder_schedule=100,0", "reconstruction_weight=0", "seraena_weight=0", "perceptual_weight=0"],
     r"no loss term trains the decoder at this stage's first step \(decoder_schedule=\(100, 0\)\)"),
    (["recipe=vidtock"], r"recipe='vidtock' is not a recipe; recipes: seraena-notebook, vidtok, opensora2, no-gan"),
])
def test_a_bad_schedule_or_recipe_is_one_line(sets, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_config("h100", sets, 8, check_paths=False)
    assert "\n" not in str(error.value)


def test_seraena_batchnorm_needs_two_frame_groups_per_rank():
    # 8 frames -> 5 decoded -> one group of 3 frames: batch 1 gives BatchNorm a single sample
    with pytest.raises(ConfigError, match=r"Seraena's BatchNorm needs at least 2 frame groups per rank, batch_size_per_gpu=1 "
                                          r"x 1 group\(s\) of 3 decoded frames gives 1"):
        load_config("test", ["seraena_weight=0.1"], 1, check_paths=False)
    assert load_config("test", ["seraena_weight=0.1", "batch_size_per_gpu=2"], 1, check_paths=False).seraena_weight == 0.1


def test_lpips_needs_clips_it_can_pool_pooled_steps_and_buckets_included():
    """LPIPS's AlexNet pools 30 pixels a side to nothing (a runtime crash mid-run, at the first pooled
    step): refused before any work, with the way out."""
    import torch

    from models.metrics import LPIPS
    from training.config.rules import LPIPS_SMALLEST_SIDE

    lpips = LPIPS()  # the premise: it runs at the smallest side and not one pixel below
    for side, runs in ((LPIPS_SMALLEST_SIDE, True), (LPIPS_SMALLEST_SIDE - 1, False)):
        clip = torch.rand(1, 3, side, side)
        with contextlib.nullcontext() if runs else pytest.raises(RuntimeError, match="too small"):
            assert torch.isfinite(lpips(clip, clip.flip(-1))).all()
    cases = [(["half_size_every=2"], "the smallest training size is 32 and half_size_every=2 pools it 2x to 16: raise height "
              "and width to 64, set half_size_every=0 or set perceptual_weight=0"),
             (["height=24", "width=48"], "the smallest training size is 24: raise height and width or set perceptual_weight=0"),
             (["buckets=32,48,24,32"], "the smallest training size is 24")]
    for sets, message in cases:
        with pytest.raises(ConfigError, match=re.escape(f"perceptual_weight=0.1: LPIPS needs clips of at least 31 pixels a side, {message}")):
            load_config("test", ["perceptual_weight=0.1", *sets], 1, check_paths=False)
    assert load_config("test", ["perceptual_weight=0.1", "half_size_every=2", "height=64", "width=64"], 1, check_paths=False).half_size_every == 2


def test_a_recipe_is_a_delta_on_any_profile_under_the_stage_and_set(tmp_path):
    vidtok = load_config("h100", ["recipe=vidtok"], 8, check_paths=False)
    assert (vidtok.seraena_schedule, vidtok.seraena_weight, vidtok.perceptual_weight, vidtok.pixel_loss,
            vidtok.adaptive_adversarial) == ((20_000, 0), 0.2, 1.0, "l1", True)
    assert vidtok.height == load_config("h100", [], 8, check_paths=False).height  # the hardware stays the profile's
    assert load_config("h100", ["recipe=vidtok", "seraena_weight=0.3"], 8, check_paths=False).seraena_weight == 0.3
    # autoencoder mode: the recipe's reference-latent terms stay off
    notebook = load_config("cpu", ["recipe=seraena-notebook"], 1, check_paths=False)
    assert (notebook.encoder_weight, notebook.decoder_weight, notebook.seraena_weight, notebook.adam_beta2) == (0, 0, 1.0, 0.95)
    # a config file's own keys win over its recipe, which wins over its base profile
    config_file = tmp_path / "mine.py"
    config_file.write_text('base_profile = "h100"\noverrides = dict(recipe="opensora2", perceptual_weight=0.25)\n')
    mine = load_config(str(config_file), [], 8, check_paths=False)
    assert (mine.perceptual_weight, mine.seraena_weight, mine.discriminator_start_step) == (0.25, 0.05, 55_000)
    for recipe in RECIPES.values():
        assert recipe.source and recipe.summary and set(recipe.values) <= set(TrainConfig.__dataclass_fields__)
        load_config("h100", [f"recipe={recipe.name}"], 8, check_paths=False)


def test_the_dry_run_prints_each_recipes_schedule():
    # the launcher's dry run prints schedule_lines; one launch shows it, the table of each recipe is checked below
    result = subprocess.run([str(REPO_ROOT / "train_taehv_h100.sh"), "8", "h100", "--recipe", "vidtok", "--dry-run"],
                            cwd=REPO_ROOT, capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    table = result.stdout.split("loss schedule")[1].split("memory (")[0]
    vidtok = load_config("h100", ["recipe=vidtok"], 8, check_paths=False)
    assert [line.strip() for line in table.strip().splitlines()[1:]] == [line.strip() for line in schedule_lines(vidtok)]
    assert "seraena             0.2    20000       0  x adaptive (VQGAN ratio)" in table
    for name in RECIPES:
        lines = schedule_lines(load_config("h100", [f"recipe={name}"], 8, check_paths=False))
        assert lines[-1] == f"recipe: {name} (training/config/recipes.py)"
    opensora = "\n".join(schedule_lines(load_config("h100", ["recipe=opensora2"], 8, check_paths=False)))
    assert "seraena            0.05    60000    2000" in opensora and "discriminator updates from step 55000" in opensora


def tiny_student():
    from models.taehv import TAEHV
    from training.step.losses import Student

    torch.manual_seed(0)
    return Student(TAEHV("taehv"))


def test_a_term_before_its_start_is_not_computed_and_the_weights_are_logged(monkeypatch):
    from training.step import losses

    config = load_config("test", ["temporal_weight=0.5", "temporal_schedule=3,2"], 1, check_paths=False)
    calls = []
    real_temporal = losses.TERM_LOSSES["temporal"]
    monkeypatch.setitem(losses.TERM_LOSSES, "temporal", lambda *a: calls.append(1) or real_temporal(*a))
    video = torch.rand(1, 8, 3, 32, 32)
    student = tiny_student()
    before = losses.forward_losses(config, student, video, None, step=2)
    assert not calls and "temporal" not in before.logged and float(before.logged["temporal_weight"]) == 0
    during = losses.forward_losses(config, student, video, None, step=3)
    assert calls and float(during.logged["temporal_weight"]) == pytest.approx(0.25)
    expected = config.reconstruction_weight * during.logged["reconstruction"] + 0.25 * during.logged["temporal"]
    assert torch.allclose(during.total, expected)


def seraena_for(config):
    from training.step.seraena import SeraenaState

    return SeraenaState(16, config.seraena_learning_rate, 16, seed=0, rank=0, device=torch.device("cpu"), amp_dtype=None)


def test_the_critic_warms_up_alone_then_its_term_reaches_the_student():
    from training.step.losses import add_seraena_term, forward_losses

    config = load_config("test", ["seraena_weight=0.1", "batch_size_per_gpu=2", "seraena_schedule=2,0",
                                  "discriminator_start_step=1"], 1, check_paths=False)
    student, seraena = tiny_student(), seraena_for(config)
    video = torch.rand(2, 8, 3, 32, 32)
    weights = {k: v.clone() for k, v in seraena.seraena.disc.state_dict().items()}
    changed = lambda: any(not torch.equal(weights[k], v) for k, v in seraena.seraena.disc.state_dict().items())  # noqa: E731
    for step, trains, reaches in ((0, False, False), (1, True, False), (2, True, True)):
        losses = forward_losses(config, student, video, None, step=step)
        total = add_seraena_term(config, seraena, losses, update_discriminator=discriminator_updates(config, step))
        assert changed() == trains, step
        assert ("seraena" in losses.logged) == reaches and torch.equal(total, losses.total) != reaches, step


def test_the_terms_that_start_later_run_once_at_their_shapes_and_change_nothing(monkeypatch):
    """The first micro-step's warm-up (cuDNN tunes each shape at its first use, so a late term would
    be tuned mid-run): every term weighted 0 runs forward and backward once, Seraena's on a copy of its
    discriminator with the correction; its weights, statistics, optimizer, buffer, generator and logs
    are untouched, and so is the student's loss and its gradients."""
    from training.step import losses

    config = load_config("test", ["seraena_weight=0.1", "batch_size_per_gpu=2", "seraena_schedule=3,0", "temporal_weight=0.5",
                                  "temporal_schedule=2,2"], 1, check_paths=False)
    student, seraena = tiny_student(), seraena_for(config)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    video = torch.rand(2, 8, 3, 32, 32)
    step_losses = losses.forward_losses(config, student, video, None, step=0)
    disc = seraena.seraena.disc
    before = {k: v.clone() for k, v in disc.state_dict().items()}
    rng, buffered, stats = seraena.seraena.rng.getstate(), len(seraena.seraena.buffer), dict(seraena.seraena.last_stats)
    calls = []
    monkeypatch.setattr(torch.nn.Conv2d, "_conv_forward", lambda self, *a, real=torch.nn.Conv2d._conv_forward:
                        calls.append(self) or real(self, *a))
    assert losses.warm_late_terms(config, step_losses, video, None, seraena, None) == ["temporal", "seraena"]
    assert all(torch.equal(before[k], v) for k, v in disc.state_dict().items())  # BatchNorm statistics included
    assert not seraena.seraena.optimizer.state and all(p.grad is None for p in disc.parameters())
    assert (seraena.seraena.rng.getstate(), len(seraena.seraena.buffer), seraena.seraena.last_stats) == (rng, buffered, stats)
    assert calls and not any(module is layer for module in calls for layer in disc.modules())  # a copy ran
    step_losses.total.backward()  # the student's own graph is intact
    assert all(p.grad is not None for p in student.parameters() if p.requires_grad)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)  # nothing to tune (aspect buckets)
    assert losses.warm_late_terms(config, step_losses, video, None, seraena, None) == []


@pytest.mark.parametrize("variant, checkpointing, channels_last, autocast", [
    ("taehv", False, False, False), ("taehv", True, True, False), ("taew2_2", False, False, False), ("taehv", False, False, True)])
def test_the_adaptive_weight_is_the_gradient_norm_ratio_on_the_decoders_last_layer_clamped(variant, checkpointing, channels_last,
                                                                                           autocast):
    """Measured from the tap (no autograd.grad with respect to the parameter or through the
    student's outputs, which DeepSpeed hooks), it equals what autograd.grad with respect to the
    weight gives (what DDP measured), with both decodes of a step, gradient checkpointing, NHWC
    activations, and a patch size (taew2_2) whose decode tail pixel-shuffles. Under DDP's bf16
    autocast (fp32 weights, bf16 activations) it equals plain fp32 autograd within bf16's tolerance."""
    from models.taehv import TAEHV
    from training.step.losses import Student, adaptive_weight, decoder_last_conv

    torch.manual_seed(0)
    taehv = TAEHV(variant).set_gradient_checkpointing(checkpointing).set_fast_path(channels_last).train()
    student = Student(taehv).tap_last_layer()
    layer = decoder_last_conv(taehv).weight
    side = 8 * taehv.patch_size * 2
    video = torch.rand(1, 5, 3, side, side)
    latents = torch.randn(1, 2, taehv.latent_channels, side // (8 * taehv.patch_size), side // (8 * taehv.patch_size))

    def losses():
        outputs = student(video, latents, want_latents=True, want_roundtrip=True, want_reference_decode=True)
        views = {name: output.view_as(output) for name, output in outputs.items()}
        reconstruction = (views["roundtrip"].float().square().mean() + (views["reference_decode"].float() - 0.3).abs().mean()
                          + views["latents"].float().square().mean())
        return views, reconstruction, 3 * views["roundtrip"].float().mean()

    views, reconstruction, adversarial = losses()  # plain fp32 autograd with respect to the weight
    rec_grad, = torch.autograd.grad(reconstruction, layer, retain_graph=True)
    adv_grad, = torch.autograd.grad(adversarial, layer, retain_graph=True)
    expected = rec_grad.norm() / (adv_grad.norm() + 1e-4)
    if autocast:  # the step as DDP runs it with mixed_precision=bf16
        with torch.autocast("cpu", torch.bfloat16):
            views, reconstruction, adversarial = losses()
    measured = adaptive_weight(reconstruction, adversarial, student.last_layer, views, 1e4)
    assert measured == pytest.approx(float(expected), rel=3e-2 if autocast else 1e-4)
    student(video, latents, want_latents=True, want_roundtrip=True, want_reference_decode=True)  # the tap records again
    assert adaptive_weight(reconstruction, 1e-9 * adversarial, student.last_layer, views, 10.0) == 10.0  # clamped
    assert layer.grad is None  # measured, not accumulated


def test_a_broken_discriminator_gives_no_nan_and_is_reset_after_k_failing_steps():
    from models.seraena import group_frames

    config = load_config("test", ["seraena_weight=0.1", "batch_size_per_gpu=2"], 1, check_paths=False)
    seraena = seraena_for(config)
    initial = {k: v.clone() for k, v in seraena.seraena.disc.state_dict().items()}
    with torch.no_grad():  # a discriminator whose weights overflowed
        next(seraena.seraena.disc.parameters()).fill_(float("inf"))
    video, decoded = torch.rand(2, 8, 3, 32, 32), torch.rand(2, 5, 3, 32, 32, requires_grad=True)
    latents = torch.randn(2, 2, 16, 4, 4)
    for _ in range(3):
        term = seraena.loss(video, decoded, latents)
        assert torch.isfinite(term)  # the correction of a broken discriminator is none, never NaN
        term.backward()
        assert torch.isfinite(decoded.grad).all()
    assert int(seraena.failing_steps) == 3 and seraena.reset_if_failing(4) == 0
    assert seraena.reset_if_failing(3) == 3 and seraena.resets == 1 and int(seraena.failing_steps) == 0
    assert all(torch.equal(initial[k], v) for k, v in seraena.seraena.disc.state_dict().items())
    assert group_frames(decoded).shape[0] == 2  # two groups: what BatchNorm needed


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


def launch(run_dir, sets, resume=None, max_steps=None):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    args = [str(REPO_ROOT / "train_taehv_h100.sh"), "1", "test", "--output-dir", str(run_dir)]
    args += ["--resume", resume] if resume else []
    args += ["--max-steps", str(max_steps)] if max_steps else []
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
def test_a_resume_in_the_middle_of_a_ramp_continues_the_schedule_exactly(clips, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # temporal ramps in over run steps 2-4; the critic warms up from step 1, its term starts at 3 (ramp 2)
    sets = [f"data_root={clips}", "max_steps=6", "checkpointing_steps=3", "validation_steps=6", "batch_size_per_gpu=2",
            "temporal_weight=0.5", "temporal_schedule=2,3", "seraena_weight=0.1", "seraena_schedule=3,2",
            "discriminator_start_step=1"]
    whole = launch(tmp_path / "whole", sets)
    assert whole.returncode == 0, whole.stderr[-3000:]
    # the same run as if stopped right after checkpoint-3 (in both ramps), then resumed
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed", ignore=shutil.ignore_patterns(
        "checkpoint-6", "final", "best_model", "logs", "validation_history.json", "FINISHED"))
    second = launch(tmp_path / "resumed", sets, resume="latest")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from " in second.stdout and "at step 3" in second.stdout, second.stdout[-3000:]

    def scalars(run, tag):
        values = {}
        for folder in sorted((tmp_path / run / "logs").rglob("events.out.tfevents*")):
            events = EventAccumulator(str(folder))
            events.Reload()
            if tag in events.Tags()["scalars"]:
                values.update({e.step: round(e.value, 6) for e in events.Scalars(tag)})
        return values

    # logged at optimizer step s: the weight of the step computed as step s-1
    assert scalars("whole", "train/temporal_weight") == {1: 0, 2: 0, 3: round(0.5 / 3, 6), 4: round(1 / 3, 6), 5: 0.5, 6: 0.5}
    assert scalars("whole", "train/seraena_weight") == {1: 0, 2: 0, 3: 0, 4: 0.05, 5: 0.1, 6: 0.1}
    for tag in ("train/temporal_weight", "train/seraena_weight", "train/loss", "train/seraena_discriminator_loss"):
        after = {step: value for step, value in scalars("whole", tag).items() if step > 3}
        assert after and scalars("resumed", tag) == after, tag  # the resumed run logs steps 4-6 alone
    # the discriminator stepped from step 1 on: 5 updates in 6 steps, in both runs
    for run in ("whole", "resumed"):
        state = torch.load(tmp_path / run / "checkpoints" / "checkpoint-6" / "seraena_state.pt", weights_only=False)
        assert {float(s["step"]) for s in state["training"]["optimizer"]["state"].values()} == {5.0}
    exported = [(tmp_path / run / "final" / "taehv.safetensors").read_bytes() for run in ("whole", "resumed")]
    assert exported[0] == exported[1]
