"""The training step's parts with real diffusers VAE classes (tiny random configs), and short real
runs through the launcher."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO_ROOT, free_port, needs_compiler

from models.metrics import LPIPS, save_random_lpips_weights
from models.reference_vae import ReferenceVAE, tiny_reference_vae, tiny_reference_vae_config, vae_class
from models.taehv import TAEHV
from training.config.schema import TrainConfig
from training.step import losses
from training.step.losses import Student, compute_losses
from training.step.seraena import SeraenaState

STUDENT_FOR = {"cogvideox": "taecvx", "hunyuan": "taehv", "wan": "taew2_1"}
FRAMES_FOR = {"cogvideox": 9, "hunyuan": 9, "wan": 5}
# launcher runs: reference folder (family and Wan layout), processes, student, clip frames, side
# (a multiple of the spatial factor, two latents across), the latent space its adapter picks
LAUNCHED_FAMILIES = {
    "cogvideox": ("cogvideox", "2.1", 2, "taecvx", 9, 32, "raw"),
    "wan": ("wan", "2.1", 1, "taew2_1", 5, 32, "normalized"),
    "wan2_2": ("wan", "2.2", 1, "taew2_2", 9, 32, "normalized"),
    "hunyuan1_5": ("hunyuan1_5", "2.1", 1, "taehv1_5", 9, 32, "scaled"),
    "ltx": ("ltx", "2.1", 1, "taeltx_2", 9, 64, "normalized"),
    "ltx2": ("ltx2", "2.1", 1, "taeltx2_3", 9, 64, "normalized"),
    "minimax_h3": ("minimax_h3", "2.1", 1, "taeh3", 22, 32, "normalized"),
}


def tiny_reference(family: str) -> ReferenceVAE:
    torch.manual_seed(0)
    return ReferenceVAE(vae_class(family)(**tiny_reference_vae_config(family)), family, sample_latents=False)


def loss_config(**weights):
    from training.config.terms import WEIGHT_KEYS

    base = dict(dict.fromkeys(WEIGHT_KEYS, 0.0), encoder_weight=0.1, decoder_weight=0.1, reconstruction_weight=10.0,
                pixel_loss="mse", lpips_bf16=False, mixed_precision="no")
    return dataclasses.replace(TrainConfig(), **{**base, **weights})  # every other key at its default


@pytest.mark.parametrize("family", ["cogvideox", "hunyuan", "wan"])
def test_frame_alignment_gives_equal_counts(family):
    reference, student = tiny_reference(family), TAEHV(STUDENT_FOR[family]).eval()
    video = torch.rand(1, FRAMES_FOR[family], 3, 32, 32)
    with torch.no_grad():
        latents = reference.encode(video)
        assert latents.shape == student.encode_video(video).shape  # N,t,16,h,w on both sides
        assert reference.decode(latents).shape == video.shape  # the reference gives back T frames
        assert student.decode_video(latents).shape == video.shape  # and so does the student
    with pytest.raises(ValueError, match="use one of"):
        reference.encode(torch.rand(1, 12, 3, 32, 32))


@pytest.mark.parametrize("family", ["cogvideox", "wan", "ltx2"])
def test_the_reference_vae_in_channels_last_3d_gives_the_same_latents(family):
    """ref_vae_channels_last changes the layout the 3-D convolutions run in, never the latents."""
    reference = tiny_reference(family)
    video = torch.rand(1, 9, 3, 32, 32)
    default = reference.encode_distribution(video)[0]
    reference.set_channels_last()
    assert any(p.dim() == 5 and p.is_contiguous(memory_format=torch.channels_last_3d) for p in reference.vae.parameters())
    torch.testing.assert_close(reference.encode_distribution(video)[0], default, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family, choice, space", [("cogvideox", "auto", "raw"), ("wan", "auto", "normalized"),
                                                   ("hunyuan", "auto", "scaled"), ("wan", "raw", "raw")])
def test_reference_latents_are_in_the_latent_space_and_decode_inverts_it(family, choice, space):
    """cogvideox: raw latents (no scaling factor); wan: (raw - latents_mean) / latents_std of the
    VAE's config; decode maps back before the VAE decodes; the cache's log-variance follows."""
    torch.manual_seed(0)
    vae = vae_class(family)(**tiny_reference_vae_config(family)).eval()
    reference = ReferenceVAE(vae, family, sample_latents=False, latent_space=choice)
    video = torch.rand(1, FRAMES_FOR[family], 3, 32, 32)
    with torch.no_grad():
        distribution = vae.encode(video.permute(0, 2, 1, 3, 4) * 2 - 1).latent_dist
        raw, raw_logvar = (t.permute(0, 2, 1, 3, 4) for t in (distribution.mean, distribution.logvar))
        channels = (1, 1, -1, 1, 1)
        scale, shift = torch.ones(1), torch.zeros(1)
        if space == "scaled":
            scale = torch.tensor(vae.config.scaling_factor)
        if space == "normalized":
            scale = 1 / torch.tensor(vae.config.latents_std).view(channels)
            shift = torch.tensor(vae.config.latents_mean).view(channels)
        latents = reference.encode(video)
        assert reference.latent_space == space
        torch.testing.assert_close(latents, (raw - shift) * scale)
        mean, logvar = reference.encode_distribution(video)
        torch.testing.assert_close(mean, latents)
        torch.testing.assert_close(logvar, raw_logvar + 2 * scale.log())
        direct = ((vae.decode(raw.permute(0, 2, 1, 3, 4)).sample + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4)
        torch.testing.assert_close(reference.decode(latents), direct, atol=1e-5, rtol=1e-4)
    if space == "normalized":  # the Wan config's statistics are far from 0 and 1: the spaces really differ
        assert (latents - raw).abs().max() > 0.5


def test_encoder_loss_falls_on_a_fixed_batch():
    reference = tiny_reference("hunyuan")
    torch.manual_seed(0)
    student = Student(TAEHV("taehv"))
    video = torch.rand(2, 9, 3, 32, 32)
    latents = reference.encode(video)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    config = loss_config(decoder_weight=0.0, reconstruction_weight=0.0)
    history = []
    for _ in range(30):
        loss, logged = compute_losses(config, student, video, latents, None)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(logged["encoder"].item())
    assert history[-1] < 0.7 * history[0] and sum(history[-5:]) < sum(history[:5])


class CallCounter:
    def __init__(self, monkeypatch):
        self.calls = {"encode": 0, "decode": 0, "seraena": 0, "lpips": 0}
        for name, method in (("encode", "encode_video"), ("decode", "decode_video")):
            original = getattr(TAEHV, method)

            def counted(self_, *args, _original=original, _name=name, **kwargs):
                self.calls[_name] += 1
                return _original(self_, *args, **kwargs)

            monkeypatch.setattr(TAEHV, method, counted)
        original_loss = SeraenaState.loss

        def counted_loss(self_, *args, **kwargs):
            self.calls["seraena"] += 1
            return original_loss(self_, *args, **kwargs)

        monkeypatch.setattr(SeraenaState, "loss", counted_loss)
        original_lpips = LPIPS.forward

        def counted_lpips(self_, *args):
            self.calls["lpips"] += 1
            return original_lpips(self_, *args)

        monkeypatch.setattr(LPIPS, "forward", counted_lpips)
        self.frame_changes = 0  # the temporal term's work
        original_changes = losses.frame_changes

        def counted_changes(video):
            self.frame_changes += 1
            return original_changes(video)

        monkeypatch.setattr(losses, "frame_changes", counted_changes)


@pytest.mark.parametrize("weights, expected_calls, terms", [
    (dict(encoder_weight=0.0, decoder_weight=0.0), {"encode": 1, "decode": 1, "seraena": 0, "lpips": 0}, {"reconstruction"}),
    (dict(reconstruction_weight=0.0, decoder_weight=0.0), {"encode": 1, "decode": 0, "seraena": 0, "lpips": 0}, {"encoder"}),
    (dict(reconstruction_weight=0.0, encoder_weight=0.0), {"encode": 0, "decode": 1, "seraena": 0, "lpips": 0}, {"decoder"}),
    (dict(reconstruction_weight=0.0, encoder_weight=0.0, decoder_weight=0.0, seraena_weight=0.1),
     {"encode": 0, "decode": 1, "seraena": 1, "lpips": 0}, {"seraena"}),
    (dict(reconstruction_weight=0.0, encoder_weight=0.0, decoder_weight=0.0, perceptual_weight=0.1),
     {"encode": 0, "decode": 1, "seraena": 0, "lpips": 1}, {"perceptual"}),
    (dict(reconstruction_weight=0.0, encoder_weight=0.0, decoder_weight=0.0, temporal_weight=0.1),
     {"encode": 0, "decode": 1, "seraena": 0, "lpips": 0}, {"temporal"}),
    (dict(seraena_weight=0.1, perceptual_weight=0.1, temporal_weight=0.1), {"encode": 1, "decode": 2, "seraena": 1, "lpips": 1},
     {"encoder", "decoder", "reconstruction", "seraena", "perceptual", "temporal"}),
])
def test_zero_weights_skip_their_computation_and_others_reach_the_student(monkeypatch, tmp_path, weights, expected_calls, terms):
    reference = tiny_reference("hunyuan")
    video = torch.rand(1, 9, 3, 32, 32)
    latents = reference.encode(video)
    torch.manual_seed(0)
    student = Student(TAEHV("taehv"))
    seraena = SeraenaState(16, 3e-4, 8, seed=0, rank=0, device=torch.device("cpu"), amp_dtype=None)
    torch.manual_seed(1)
    lpips = LPIPS.from_files(*save_random_lpips_weights(tmp_path))  # random backbone: enough to carry gradients
    counter = CallCounter(monkeypatch)
    loss, logged = compute_losses(loss_config(**weights), student, video, latents, seraena, lpips)
    assert counter.calls == expected_calls
    # the loss terms (Seraena's game statistics, seraena_*, are logged beside its term)
    assert {k for k in logged if not k.startswith("seraena_")} - {"loss", "psnr"} == terms
    assert bool({k for k in logged if k.startswith("seraena_")}) == ("seraena" in terms)
    assert counter.frame_changes == (2 if "temporal" in terms else 0)  # decoded and input: weight 0 computes nothing
    loss.backward()
    encoder_grad = student.taehv.encoder[0].weight.grad
    decoder_grad = student.taehv.decoder[1].weight.grad
    assert (encoder_grad is not None and encoder_grad.abs().sum() > 0) == bool(terms & {"encoder", "reconstruction"})
    assert decoder_grad is not None and decoder_grad.abs().sum() > 0 or terms == {"encoder"}


def test_chroma_term_is_the_round_trips_chroma_error():
    """MSE of the BT.601 Cb and Cr of the round trip against the input's: the chroma PSNR's error."""
    from models.metrics import chroma_psnr

    video = torch.rand(1, 8, 3, 32, 32)
    torch.manual_seed(0)
    student = Student(TAEHV("taehv"))
    weights = dict(reconstruction_weight=0.0, encoder_weight=0.0, decoder_weight=0.0, chroma_weight=3.0)
    loss, logged = compute_losses(loss_config(**weights), student, video, None, None)
    with torch.no_grad():
        decoded = student.taehv.decode_video(student.taehv.encode_video(video))
    mse = 10 ** (-chroma_psnr(decoded, video[:, : decoded.shape[1]]) / 10)
    assert logged["chroma"].item() == pytest.approx(mse.item(), rel=1e-4)
    assert loss.item() == pytest.approx(3.0 * logged["chroma"].item(), rel=1e-6)
    loss.backward()
    assert student.taehv.encoder[0].weight.grad.abs().sum() > 0


@pytest.mark.parametrize("distilling", [True, False])
def test_temporal_term_is_the_flicker_of_the_judged_decode(distilling):
    """MSE of frame-to-frame changes, decoded vs input (the flicker metric squared, averaged over
    pairs), on the decode of reference latents when distilling, else on the round trip, whose
    encoder it then reaches too."""
    from models.metrics import temporal_error

    reference = tiny_reference("hunyuan")
    video = torch.rand(1, 9, 3, 32, 32)
    latents = reference.encode(video) if distilling else None
    torch.manual_seed(0)
    student = Student(TAEHV("taehv"))
    weights = dict(reconstruction_weight=0.0, encoder_weight=0.0, decoder_weight=0.0, temporal_weight=2.0)
    loss, logged = compute_losses(loss_config(**weights), student, video, latents, None)
    with torch.no_grad():
        decoded = student.taehv.decode_video(latents if distilling else student.taehv.encode_video(video))
    pairs = temporal_error(decoded, video[:, : decoded.shape[1]])
    assert logged["temporal"].item() == pytest.approx(pairs.pow(2).mean().item(), rel=1e-4)
    assert loss.item() == pytest.approx(2.0 * logged["temporal"].item(), rel=1e-6)
    loss.backward()
    assert student.taehv.decoder[1].weight.grad.abs().sum() > 0
    encoder_grad = student.taehv.encoder[0].weight.grad
    assert (encoder_grad is not None and encoder_grad.abs().sum() > 0) == (not distilling)


def test_validation_reports_flicker_beside_psnr_and_lower_is_better():
    """validate() on held-out clips in one process: `flicker` is the mean over clips of
    models.metrics.flicker of the round trip, 0 for a decoder that gives the input back; it is in
    the validation line, and as best_metric a higher value is no improvement."""
    from models.metrics import flicker
    from training.config.load import load_config
    from training.loop.validation import record_validation, validate, validation_line

    config = load_config("test", ["best_metric=flicker"], 1, check_paths=False)  # autoencoder mode, 8 frames
    torch.manual_seed(0)
    clips = [{"video": (torch.rand(8, 3, 32, 32) * 255).to(torch.uint8)} for _ in range(2)]
    run = SimpleNamespace(config=config, validation_dataset=clips, lpips=None, accelerator=SimpleNamespace(
        process_index=0, num_processes=1, device=torch.device("cpu"), is_main_process=False))
    model = TAEHV("taehv").eval()
    metrics = validate(run, model)
    with torch.no_grad():
        expected = []
        for clip in clips:
            video = clip["video"][None].float() / 255
            decoded = model(video)
            expected.append(flicker(decoded, video[:, : decoded.shape[1]]).item())
    assert metrics["flicker"] == pytest.approx(sum(expected) / 2, rel=1e-5) and metrics["flicker"] > 0
    assert re.search(r"\| ssim: [\d.]+ \| flicker: [\d.]+ \| by frame:", validation_line(4, metrics))

    class GivesTheInputBack(torch.nn.Module):
        def forward(self, video):
            return video[:, :5]  # the round trip's 5 frames, exactly

    assert validate(run, GivesTheInputBack())["flicker"] == 0
    run.progress = SimpleNamespace(step=4, best_value=0.01, best_step=2, validations_without_improvement=0)
    assert not record_validation(run, {**metrics, "flicker": 0.02})  # higher flicker: no new best_model/
    assert (run.progress.best_value, run.progress.validations_without_improvement) == (0.01, 1)


def test_validation_in_batches_scores_every_clip_once_as_one_at_a_time(monkeypatch):
    """validation_batch_size clips per forward: the metrics equal those of one clip at a time (an
    odd count leaves a short last batch, filled up with a repeat no metric counts), with fewer
    forwards; the line carries its time."""
    from training.config.load import load_config
    from training.loop.validation import validate, validation_line

    torch.manual_seed(0)
    clips = [{"video": (torch.rand(8, 3, 32, 32) * 255).to(torch.uint8)} for _ in range(5)]
    model = TAEHV("taehv").eval()
    forwards = []
    monkeypatch.setattr(model, "forward", lambda video, _forward=model.forward: forwards.append(len(video)) or _forward(video))
    results = {}
    for size in (1, 2):
        config = load_config("test", [f"validation_batch_size={size}", "validation_samples=5"], 1, check_paths=False)
        run = SimpleNamespace(config=config, validation_dataset=clips, lpips=None, accelerator=SimpleNamespace(
            process_index=0, num_processes=1, device=torch.device("cpu"), is_main_process=False))
        forwards.clear()
        results[size] = (validate(run, model), list(forwards))
    assert results[1][1] == [1] * 5 and results[2][1] == [2, 2, 2]  # the short last batch filled up with a repeat
    assert results[2][0] == pytest.approx(results[1][0], rel=1e-5)
    assert validation_line(4, results[2][0], 1.25).endswith(" dB | 1.2 s")


@pytest.fixture(scope="module")
def tiny_vae_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference_vaes")
    for name, (family, layout, *_) in LAUNCHED_FAMILIES.items():
        torch.manual_seed(0)
        tiny_reference_vae(family, layout).save_pretrained(str(root / name / "vae"))
    return root


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


def launch(ngpu, run_dir, sets, resume=None):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    args = [str(REPO_ROOT / "train_taehv_h100.sh"), str(ngpu), "test", "--output-dir", str(run_dir)]
    args += ["--resume", resume] if resume else []
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAUNCHED_FAMILIES))
def test_distillation_runs_with_each_reference_family(name, tiny_vae_folders, clips, tmp_path, monkeypatch):
    """The launcher distills from each family's real diffusers class (tiny random config) into its
    paired student and exports final/ with the latent space recorded. The 2-process run also meets
    a validation clip whose reference latents are NaN on rank 1 (a bf16 overflow on a GPU): skipped
    and counted at every validation, named once, and the run finishes with equal weights."""
    family, _, processes, student_variant, frames, side, space = LAUNCHED_FAMILIES[name]
    run_dir = tmp_path / "run"
    steps = 4 if processes == 2 else 2  # the 2-process run validates twice
    held_out = []
    if processes == 2:  # validation_fraction=0.3 holds out sample_0000 (rank 0 scores it) and sample_0005 (rank 1)
        held_out = ["validation_fraction=0.3"]
        monkeypatch.setenv("TAEHV_FAULT_NONFINITE_REFERENCE_CLIP", "sample_0005.mp4")
        monkeypatch.setenv("TAEHV_FAULT_RANK", "1")
    result = launch(processes, run_dir, [*held_out,
        f"data_root={clips}", "use_ref_vae=true", f"ref_vae_family={family}", f"ref_vae_path={tiny_vae_folders / name}",
        f"n_frames={frames}", "encoder_weight=0.1", "decoder_weight=0.1", "seraena_weight=0.1",
        # Seraena's BatchNorm needs 2 frame groups per rank: 5 frames hold one
        f"batch_size_per_gpu={2 if frames < 6 else 1}",
        f"model_variant={student_variant}", f"height={side}", f"width={side}", f"max_steps={steps}",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"distilling from {family}" in result.stdout
    # one process runs unwrapped, as accelerate runs a lone GPU process (no DDP bucket copies)
    assert (" (one process: no DDP)" if processes == 1 else " (DDP)") in result.stdout
    output = result.stdout + result.stderr
    student = dict(re.findall(r"rank (\d+) of \d+: final weights fingerprint ([0-9a-f]{16})", output))
    discriminator = dict(re.findall(r"rank (\d+) of \d+: seraena fingerprint ([0-9a-f]{16})", output))
    assert len(student) == len(discriminator) == processes
    assert len(set(student.values())) == len(set(discriminator.values())) == 1  # identical on every rank
    # the export is named for its variant, as the public files are (upstream builds the architecture from it)
    assert sorted(p.name for p in (run_dir / "final").iterdir()) == sorted(
        [f"{student_variant}.pth", f"{student_variant}.safetensors", "model_info.json"])
    model = TAEHV.from_pretrained(run_dir / "final" / f"{student_variant}.pth")
    assert model.variant == student_variant
    # the export is the EMA saved in the last checkpoint
    ema = torch.load(run_dir / "checkpoints" / f"checkpoint-{steps}" / "ema_state.pt", weights_only=True)
    exported = torch.load(run_dir / "final" / f"{student_variant}.pth", weights_only=True)
    assert all(torch.equal(ema["shadow"][k].cpu(), v) for k, v in exported.items())
    info = json.loads((run_dir / "final" / "model_info.json").read_text())
    assert info["step"] == steps and info["metrics"]["psnr"] > 0
    assert info["reference"] == {"family": family, "latent_space": space}
    topology = json.loads((run_dir / "checkpoints" / f"checkpoint-{steps}" / "topology.json").read_text())
    assert topology["ref_vae_latent_space"] == space
    if processes == 2:
        log = (run_dir / "train.log").read_text()
        assert log.count("validation clip sample_0005.mp4 (rank 1) skipped: the cogvideox reference VAE produced "
                         "non-finite latents") == 1, log
        assert len(re.findall(r"Validation at step [24] \| .*\| skipped_clips: 1 \|", log)) == 2, log
        history = json.loads((run_dir / "validation_history.json").read_text())
        assert [entry["skipped_clips"] for entry in history] == [1, 1] and all(entry["psnr"] > 0 for entry in history)


@pytest.fixture(scope="module")
def probe_report(clips, tmp_path_factory) -> dict:
    """training/taehv_train.py's main as one rank under tests/training_probe.py, 3 steps of 2
    micro-steps with Seraena on: its report of global seedings and of device reads per micro-step
    (one run serves both tests)."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "training_probe.py"), "--config", "test",
                             "--output-dir", str(tmp_path_factory.mktemp("probe") / "run"), "--max-steps", "3", "--set", f"data_root={clips}",
                             "--set", "seraena_weight=0.1", "--set", "batch_size_per_gpu=2", "--set", "gradient_accumulation_steps=2",
                             "--set", "global_batch_size=0"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(result.stdout.rpartition("PROBE ")[2] or "{}")
    assert report.get("exit_code") == 0, result.stderr[-3000:]
    return report


def test_nothing_reseeds_a_global_generator_after_the_per_rank_seeding(probe_report):
    """Each rank draws its own noise (the reference VAE's latent sample, Seraena's choices) once
    set_seed(..., device_specific=True) ran: a later torch.manual_seed, even inside a fork_rng of
    the CPU generator, would reseed every CUDA device alike on all ranks, which no CPU run shows.
    Records every global seeding call in a whole run (tests/training_probe.py)."""
    assert probe_report["seeding"]["per_rank_seeding_done"]
    assert probe_report["seeding"]["calls"] == []


def test_an_optimizer_step_reads_the_device_once(probe_report):
    """Each read of a tensor's value on the host (.item(), .cpu(), bool(), float(), ...) stalls a
    GPU step until every queued kernel ran: an optimizer step reads only the agreement's table at
    its window's end (its non-finite checks are device flags folded into it; losses and norms are
    read at log intervals); the micro-steps inside the window read nothing, their flags wait for
    that table. Counted in a whole run (tests/training_probe.py)."""
    steps = probe_report["reads"]
    assert len(steps) == 6
    inside, ends = steps[0::2], steps[1::2]
    assert inside == [[], [], []], steps
    assert all(len(reads) == 1 and reads[0].startswith("Tensor.tolist at agreement.py:") for reads in ends), steps


def test_missing_reference_vae_is_an_error_not_a_silent_fallback(clips, tmp_path):
    broken = tmp_path / "vae"  # a folder that looks right to the config check but holds no loadable VAE
    broken.mkdir()
    (broken / "config.json").write_text('{"_class_name": "AutoencoderKLCogVideoX", "in_channels": "three"}')
    result = launch(1, tmp_path / "run", [f"data_root={clips}", "use_ref_vae=true", f"ref_vae_path={broken}",
                                         "n_frames=9", "encoder_weight=0.1", "decoder_weight=0.1"])
    assert result.returncode != 0
    assert f"cannot load the cogvideox reference VAE from '{broken}'" in result.stderr


@pytest.mark.slow
def test_nonfinite_and_oom_steps_are_skipped_then_too_many_stop_the_run(clips, tmp_path, monkeypatch):
    monkeypatch.setenv("TAEHV_FAULT_NONFINITE_MICRO_STEPS", "2")
    monkeypatch.setenv("TAEHV_FAULT_OOM_MICRO_STEPS", "4")
    # one process, raised as its backward starts: its gradients are dropped (one from inside a DDP
    # backward that reduces stops the run instead: test_launchers' out-of-memory tests)
    monkeypatch.setenv("TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS", "5")
    monkeypatch.setenv("TAEHV_FAULT_CUDNN_ERROR_MICRO_STEPS", "7")  # cuDNN's allocation failure, a RuntimeError
    monkeypatch.setenv("TAEHV_FAULT_WRITE_FAILS", "history,best_model,final")  # rank 0's own writes, each once
    once = launch(1, tmp_path / "once", [f"data_root={clips}"])
    run_dir = tmp_path / "once"
    assert once.returncode == 3, once.stderr[-3000:]  # the export failed: the run says so and how to export again
    assert (f"stopped on rank 0: the export to {run_dir / 'final'} failed on rank 0: [Errno 28] No space left on device "
            "(injected: final at step 4); the checkpoint checkpoint-4 is complete: free space, then --resume latest exports") in once.stderr
    assert f"continue with: {REPO_ROOT / 'train_taehv_h100.sh'} 1 test --output-dir {run_dir} --resume latest" in once.stderr
    log = (run_dir / "train.log").read_text()
    assert "validation_history.json not updated at step 2: [Errno 28]" in log and "NOT saved: [Errno 28]" in log
    history = json.loads((run_dir / "validation_history.json").read_text())
    assert [entry["step"] for entry in history] == [4] and (run_dir / "best_model" / "taehv.pth").is_file()
    assert not (run_dir / "final").exists() and not list(run_dir.glob(".tmp-*"))  # nothing half-written
    monkeypatch.delenv("TAEHV_FAULT_WRITE_FAILS")
    exported = launch(1, run_dir, [], resume="latest")
    assert exported.returncode == 0 and (run_dir / "final" / "taehv.pth").is_file(), exported.stderr[-3000:]
    assert "non-finite loss on rank 0 at micro-step 2 (step 2): skipped on all ranks (1 so far, 1 in a row)" in log
    assert "out of memory on rank 0 at micro-step 4 (step 3): skipped on all ranks (1 so far, 1 in a row)" in log
    assert ("out of memory on rank 0 (in a backward before this micro-step; its accumulated gradients dropped) at "
            "micro-step 6 (step 3): skipped on all ranks (2 so far, 2 in a row)") in log
    assert "out of memory on rank 0 at micro-step 7 (step 3): skipped on all ranks (3 so far, 3 in a row)" in log
    for name in ("TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS", "TAEHV_FAULT_CUDNN_ERROR_MICRO_STEPS"):
        monkeypatch.delenv(name)
    assert "Step 4/4" in log
    monkeypatch.delenv("TAEHV_FAULT_NONFINITE_MICRO_STEPS")
    monkeypatch.setenv("TAEHV_FAULT_OOM_MICRO_STEPS", "1,2,3")
    oom = launch(1, tmp_path / "oom", [f"data_root={clips}", "max_consecutive_bad_steps=2"])
    assert oom.returncode != 0
    assert "3 out-of-memory steps in a row (max_consecutive_bad_steps=2)" in oom.stderr
    assert "Lower batch_size_per_gpu" in oom.stderr
    monkeypatch.delenv("TAEHV_FAULT_OOM_MICRO_STEPS")
    monkeypatch.setenv("TAEHV_FAULT_NONFINITE_MICRO_STEPS", "2,3,4")
    many = launch(1, tmp_path / "many", [f"data_root={clips}", "max_consecutive_bad_steps=2"])
    assert many.returncode != 0
    assert "3 non-finite steps in a row (max_consecutive_bad_steps=2)" in many.stderr
    assert (tmp_path / "many" / "checkpoints" / "checkpoint-1").is_dir()


@pytest.fixture(scope="module")
def accumulating_run(clips, tmp_path_factory):
    """One launch for two tests: Seraena on, 2 micro-steps per optimizer step, 4 steps, a checkpoint
    after each, and the write of step 2's failing."""
    run_dir = tmp_path_factory.mktemp("accumulating") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TAEHV_FAULT_CHECKPOINT_FAIL_STEPS", "2")
        result = launch(1, run_dir, [f"data_root={clips}", "n_frames=8", "seraena_weight=0.1", "batch_size_per_gpu=2",
                                     "gradient_accumulation_steps=2", "checkpointing_steps=1"])
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_tensorboard_holds_the_training_scalars(accumulating_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = accumulating_run
    # 4 optimizer steps of 2 micro-steps each: the discriminator stepped 4 times, once per student step
    seraena = torch.load(run_dir / "checkpoints" / "checkpoint-4" / "seraena_state.pt", weights_only=False)
    assert {float(s["step"]) for s in seraena["training"]["optimizer"]["state"].values()} == {4.0}
    events = EventAccumulator(str(run_dir / "logs" / "taehv"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"train/loss", "train/reconstruction", "train/seraena", "train/psnr", "train/lr", "train/grad_norm",
                "train/samples_per_second", "train/data_wait_fraction", "train/peak_memory_gb",
                "data/skipped_decode_error", "val/psnr", "train/seraena_discriminator_loss",
                "train/seraena_discriminator_accuracy", "train/seraena_gradient_std"}
    assert expected <= tags, expected - tags
    accuracy = [e.value for e in events.Scalars("train/seraena_discriminator_accuracy")]
    assert all(0 <= a <= 1 for a in accuracy) and len(accuracy) == 4
    # every validation frame, animated: a GIF of input | reconstruction | error (5 frames of 32x96)
    assert "val/sample_clip0" in events.Tags()["images"]  # one held-out clip here: one GIF
    clip = events.Images("val/sample_clip0")[-1]
    assert clip.encoded_image_string[:6] == b"GIF89a" and (clip.width, clip.height) == (96, 32)
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    assert {"val/ssim", "val/flicker"} <= tags and "val/sample" in events.Tags()["images"]
    # 8 frames = 2 latents; the round trip gives 5 frames back, each position scored on its own
    assert {f"val/psnr_frame{t}" for t in range(5)} <= tags and "val/psnr_frame5" not in tags
    log = (run_dir / "train.log").read_text()
    assert re.search(r"Validation at step 4 \| psnr: [\d.]+ dB \| ssim: [\d.]+ \| flicker: [\d.]+ \| by frame: ([\d.]+ ){5}dB",
                     log), log
    history = json.loads((run_dir / "validation_history.json").read_text())
    assert [h["step"] for h in history] == [2, 4] and all(h["psnr"] > 0 and 0 < h["ssim"] <= 1 and h["flicker"] > 0 for h in history)
    best = max(history, key=lambda h: h["psnr"])
    info = json.loads((run_dir / "best_model" / "model_info.json").read_text())
    assert info["step"] == best["step"] and info["metrics"] == {k: v for k, v in best.items() if k != "step"}
    assert info["best_metric"] == "psnr"
    assert len(info["config_hash"]) == 12
    assert TAEHV.from_pretrained(run_dir / "best_model" / "taehv.safetensors").variant == "taehv"


def test_early_stopping_finishes_the_run_with_an_export(clips, tmp_path):
    """learning_rate=0: the metric cannot improve, so patience 1 stops at the second validation."""
    result = launch(1, tmp_path / "run", [f"data_root={clips}", "learning_rate=0", "validation_steps=1",
                                          "early_stopping_patience=1", "max_steps=4", "warmup_steps=0"])
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert "early stopping: psnr has not improved for 1 validations (best" in log and "at step 1)" in log
    assert "Step 3/4" not in log and json.loads((tmp_path / "run" / "final" / "model_info.json").read_text())["step"] == 2
    assert (tmp_path / "run" / "checkpoints" / "checkpoint-2").is_dir()


def test_failed_checkpoint_write_keeps_the_previous_one_and_training_goes_on(accumulating_run):
    log = (accumulating_run / "train.log").read_text()
    assert "checkpoint at step 2 FAILED on rank 0 ([Errno 28] No space left on device (injected)); " \
           "kept checkpoint-1; training continues" in log
    assert "Step 4/4" in log and (accumulating_run / "final" / "taehv.pth").is_file()
    assert sorted(p.name for p in (accumulating_run / "checkpoints").iterdir()) == ["checkpoint-1", "checkpoint-3", "checkpoint-4"]



def test_weight_ema_blends_in_fp32_and_returns_to_its_device_after_loading():
    """accelerate hands custom state back on the CPU; the average must live on the training device
    again (here the meta device stands in for a GPU), and blend like the textbook formula."""
    from training.step.ema import WeightEMA

    module = torch.nn.Linear(3, 2).to(torch.bfloat16)
    weights = {k: v.float() for k, v in module.state_dict().items()}
    ema = WeightEMA(weights, decay=0.9, device=torch.device("cpu"))
    with torch.no_grad():
        module.weight.add_(1.0)
    ema.update(dict(module.named_parameters()))
    expected = 0.9 * weights["weight"] + 0.1 * module.weight.float()
    assert ema.shadow["weight"].dtype == torch.float32 and torch.allclose(ema.shadow["weight"], expected)
    moved = WeightEMA(weights, decay=0.5, device=torch.device("meta"))
    moved.load_state_dict(ema.state_dict())  # as from a CPU-mapped checkpoint
    assert moved.decay == 0.9 and {v.device.type for v in moved.shadow.values()} == {"meta"}


def test_the_weight_ema_follows_the_parameters_it_listed_once_bit_for_bit():
    """Without DeepSpeed the EMA lists the parameters once and lerps them each step: the same values
    as blending in master_weights each step, also after a parameter's data is replaced, with a frozen
    encoder, and after its averages are loaded again."""
    from training.step.ema import WeightEMA
    from training.step.weights import master_weights

    torch.manual_seed(0)
    student = Student(TAEHV("taehv"))
    student.taehv.encoder.requires_grad_(False)
    student.frozen_weights = {f"encoder.{k}": v.detach().clone() for k, v in student.taehv.encoder.named_parameters()}
    accelerator = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None), device=torch.device("cpu"))
    listed, walked = (WeightEMA(master_weights(accelerator, student), 0.9, accelerator.device) for _ in range(2))
    decoder = list(student.taehv.decoder.parameters())
    for step in range(4):
        with torch.no_grad():
            for param in decoder:
                param.add_(torch.randn_like(param))
            if step == 1:  # replaced, not written in place
                decoder[0].data = torch.randn_like(decoder[0])
        if step == 2:
            listed.load_state_dict(listed.state_dict())
        listed.step(accelerator, student)
        walked.update(master_weights(accelerator, student))
    assert listed.blended is not None and listed.shadow.keys() == walked.shadow.keys()
    assert all(torch.equal(listed.shadow[k], walked.shadow[k]) for k in walked.shadow)


@pytest.mark.slow
@needs_compiler
def test_the_partitioned_ema_equals_the_gathered_one_bit_for_bit(tmp_path):
    """ZeRO-2, 2 processes, real optimizer steps of the student: the EMA each rank keeps of its own
    partition (no collective per step) gathers to exactly the EMA of the gathered fp32 masters,
    and survives a checkpoint's state round trip; each rank holds only part of the fragments."""
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                             str(REPO_ROOT / "accelerate_configs" / "deepspeed_cpu.yaml"), "--num_processes", "2",
                             "--main_process_port", str(free_port()), str(REPO_ROOT / "tests" / "ema_partition_run.py"),
                             str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = re.findall(r"rank (\d): partitioned EMA equal (\w+), moved (\w+), round trip (\w+), fragments held (\d+) of (\d+)",
                       result.stdout)
    assert len(lines) == 2 and all(line[1:4] == ("True", "True", "True") for line in lines), result.stdout[-2000:]
    assert all(0 < int(held) < int(total) for *_, held, total in lines)


def test_half_size_every_trains_every_nth_step_on_the_clips_pooled_2x():
    from training.config.load import load_config
    from training.config.schema import ConfigError
    from training.step.losses import at_step_scale

    config = load_config("test", ["half_size_every=2"], 1, check_paths=False)
    video = torch.rand(2, 8, 3, 32, 32)
    assert at_step_scale(config, video, 1) is video
    half = at_step_scale(config, video, 2)
    assert half.shape == (2, 8, 3, 16, 16)
    assert half[1, 3, :, 0, 0].tolist() == pytest.approx(video[1, 3, :, :2, :2].mean((1, 2)).tolist())
    with pytest.raises(ConfigError, match=r"half_size_every=2 halves 40x32: height and width \(and buckets\) must be multiples of 16"):
        load_config("test", ["half_size_every=2", "height=40"], 1, check_paths=False)
    with pytest.raises(ConfigError, match=r"half_size_every=2 needs autoencoder mode"):
        load_config("test", ["half_size_every=2", "latent_cache=/cache"], 1, check_paths=False)
