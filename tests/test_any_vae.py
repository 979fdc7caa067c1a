"""A TAE for any diffusers video VAE: the classes no family of ours names, as tiny random configs of
the real classes, measured at load time (models/vae_geometry.py) and distilled through the launcher
with ref_vae_family=auto model_variant=auto. The seven named families are tested in
test_training.py and test_reference_families.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, free_port

diffusers = pytest.importorskip("diffusers")

# class: (tiny config of the real class, a frame count it takes, what must be measured:
# latent channels, spatial factor, time factor, frame rule, the student model_variant=auto builds)
CLASSES = {
    "AutoencoderKLMagvit": (dict(block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=4,
                                 spatial_group_norm=False), 9, (16, 8, 4, "4k+1", "taehv")),
    "AutoencoderKLKVAEVideo": (dict(ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=1), 9, (16, 8, 4, "4k+1", "taehv")),
    "AutoencoderKLQwenImage": (dict(base_dim=8, num_res_blocks=1), 9, (16, 8, 4, "4k+1", "taehv")),
    "AutoencoderVidTok": (dict(ch=8, ch_mult=[1, 2, 4, 4], num_res_blocks=1), 8, (4, 8, 4, "4k", "taehv_c4_s8_t4")),
    "AutoencoderKLAllegro": (dict(block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4), 8,
                             (4, 8, 4, "4k", "taehv_c4_s8_t4_notrim")),
    "AutoencoderKLCosmos": (dict(encoder_block_out_channels=(8,) * 4, decode_block_out_channels=(8,) * 4,
                                 attention_resolutions=(), num_layers=1, resolution=64), 9, (16, 8, 8, "8k+1", "taehv_c16_s8_t8")),
}
MOCHI = dict(encoder_block_out_channels=(32,) * 4, decoder_block_out_channels=(32,) * 4, layers_per_block=(1,) * 5,
             add_attention_block=(False,) * 5)


@pytest.fixture(scope="module")
def vae_folders(tmp_path_factory):
    """<root>/<class>/vae: each class saved as a diffusers pipeline folder; a measurement cache
    for this module only (XDG_CACHE_HOME), shared by the tests here and the launches they make."""
    root = tmp_path_factory.mktemp("any_vae")
    for name, kwargs in [*((n, c[0]) for n, c in CLASSES.items()), ("AutoencoderKLMochi", MOCHI)]:
        torch.manual_seed(0)
        getattr(diffusers, name)(**kwargs).save_pretrained(str(root / name / "vae"))
    cache = tmp_path_factory.mktemp("cache")
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield root
    if previous is None:
        os.environ.pop("XDG_CACHE_HOME")
    else:
        os.environ["XDG_CACHE_HOME"] = previous


@pytest.mark.parametrize("name", list(CLASSES))
def test_each_class_is_measured_and_gets_a_student_of_its_shape(name, vae_folders):
    from models.vae_geometry import frame_rule_text, geometry_of, student_for, valid_frame_counts

    _, frames, (channels, spatial, time, rule, variant) = CLASSES[name]
    geometry = geometry_of(str(vae_folders / name))
    student, problem = student_for(geometry)
    assert problem == ""
    assert (geometry.class_name, geometry.latent_channels, geometry.spatial_factor, geometry.time_factor) == (name, channels, spatial, time)
    assert (frame_rule_text(geometry, student), student.variant) == (rule, variant)
    assert frames in valid_frame_counts(geometry, student)
    # what the student gives is what the teacher gives, for the counts a run may use
    for n, t, decoded in geometry.frame_map:
        if n in valid_frame_counts(geometry, student):
            assert (student.latent_frame_count(n), student.decoded_frame_count(t)) == (t, decoded)
    assert geometry.needs_tiling == (name == "AutoencoderKLAllegro")
    assert geometry.deterministic == (name == "AutoencoderKLCosmos")
    cached = geometry_of(str(vae_folders / name))  # the second time from the cache
    assert cached == geometry


def test_a_time_factor_the_student_cannot_take_is_refused_in_one_line(vae_folders):
    from training.config.load import load_config
    from training.config.schema import ConfigError

    with pytest.raises(ConfigError) as refused:
        load_config("test", ["use_ref_vae=true", f"ref_vae_path={vae_folders / 'AutoencoderKLMochi'}", "model_variant=auto",
                             "n_frames=13"], 1)
    message = str(refused.value)
    assert "\n" not in message
    assert "AutoencoderKLMochi measures 6x in time (13 frames -> 3 latents)" in message and "1x, 2x, 4x or 8x" in message


def test_the_launcher_refuses_it_in_one_line_before_any_run_folder_exists(vae_folders, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    command = [str(REPO_ROOT / "train_taehv_h100.sh"), "1", "test", "--output-dir", str(tmp_path / "run"),
               "--set", "use_ref_vae=true", "--set", f"ref_vae_path={vae_folders / 'AutoencoderKLMochi'}",
               "--set", "ref_vae_family=auto", "--set", "model_variant=auto", "--set", "n_frames=13"]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "AutoencoderKLMochi measures 6x in time" in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_a_named_variant_that_does_not_fit_a_measured_vae_names_what_was_measured(vae_folders):
    from training.config.load import load_config
    from training.config.schema import ConfigError

    with pytest.raises(ConfigError, match=r"model_variant=taehv \(16 latent channels.*AutoencoderVidTok: 4 latent "
                                          r"channels.*use model_variant=auto"):
        load_config("test", ["use_ref_vae=true", f"ref_vae_path={vae_folders / 'AutoencoderVidTok'}", "n_frames=8"], 1)


def test_auto_names_the_family_of_a_named_class_and_its_public_student(tmp_path):
    from models.reference_vae import tiny_reference_vae
    from training.config.load import load_config

    tiny_reference_vae("wan", "2.2").save_pretrained(str(tmp_path / "wan22" / "vae"))
    config = load_config("test", ["use_ref_vae=true", f"ref_vae_path={tmp_path / 'wan22'}", "model_variant=auto",
                                  "n_frames=9", "height=64", "width=64"], 1)
    assert (config.ref_vae_family, config.reference_family, config.reference_geometry) == ("auto", "wan", {})
    assert config.student_args["variant"] == "taew2_2"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLASSES))
def test_a_tae_for_each_class_trains_exports_and_scores_through_the_launcher(name, vae_folders, tmp_path):
    """The issue's command for each class: a few steps, final/ exported, and inference.py scores
    the exported .safetensors alone (no model_info.json beside it) against the reference; the
    converter makes another such file from the run's checkpoint."""
    _, frames, (channels, _, _, _, variant) = CLASSES[name]
    folder = vae_folders / name
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    sets = ["use_ref_vae=true", f"ref_vae_path={folder}", "ref_vae_family=auto", "model_variant=auto", f"n_frames={frames}",
            "pretrained_model_path=", "encoder_weight=0.1", "decoder_weight=0.1", "validation_samples=1"]
    command = [str(REPO_ROOT / "train_taehv_h100.sh"), "1", "test", "--output-dir", str(run_dir), "--max-steps", "2"]
    for item in sets:
        command += ["--set", item]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"reference VAE measured: {name}: {channels} latent channels" in result.stdout  # the launch header
    assert f"student: {variant} (chosen by model_variant=auto" in result.stdout
    info = json.loads((run_dir / "final" / "model_info.json").read_text())
    assert info["model_args"]["variant"] == variant and info["model_args"]["latent_channels"] == channels
    assert info["reference"]["family"] == name and info["reference"]["geometry"]["class_name"] == name
    alone = tmp_path / "alone" / "my_tae.safetensors"
    alone.parent.mkdir()
    assert sorted(p.name for p in (run_dir / "final").iterdir()) == sorted([f"{variant}.pth", f"{variant}.safetensors", "model_info.json"])
    alone.write_bytes((run_dir / "final" / f"{variant}.safetensors").read_bytes())
    import inference

    report = tmp_path / "report"
    assert inference.main(["--model", str(alone), "--held-out-of", str(run_dir), "--num-samples", "1", "--frames", str(frames),
                           "--height", "32", "--width", "32", "--ref-vae-path", str(folder), "--no-media", "--device", "cpu",
                           "--out", str(report)]) == 0
    scored = json.loads((report / "report.json").read_text())
    assert scored["model"]["variant"] == variant
    assert scored["mean"]["decode_reference_latents"]["psnr"] > 0 and scored["mean"]["reference_round_trip"]["psnr"] > 0
    assert re.search(r"Validation at step 2 \| psnr: [\d.]+ dB", result.stdout + result.stderr)
    # the converter takes the run's student from its checkpoint; its .safetensors alone loads again
    from models.taehv import TAEHV
    from scripts.convert_checkpoint import main as convert

    assert convert([str(run_dir / "checkpoints" / "checkpoint-2"), "--out", str(tmp_path / "converted" / "tae.safetensors")]) == 2
    converted = tmp_path / "converted" / f"{variant}.safetensors"  # a folder gets the variant's names
    assert convert([str(run_dir / "checkpoints" / "checkpoint-2"), "--out", str(converted.parent)]) == 0
    (converted.parent / "model_info.json").unlink()
    assert TAEHV.from_pretrained(converted).args == TAEHV.from_pretrained(alone).args
