"""A missing public input is named with where it comes from and the command that fetches it: the
reference VAE's Hugging Face repository that the folder's name and the family say (not the family's
default whatever the folder), the public TAEHV weights (madebyollin/taehv on GitHub), LPIPS's files."""

import shlex
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from models.public_files import LPIPS_FILES, PUBLIC_TAEHV_BRANCHES, taehv_weights_url
from models.reference_families import FAMILY_RECORDS, hub_repo_for
from training.config.inputs import input_problems
from training.config.load import load_config


def problem_for(key: str, overrides: list[str]) -> str:
    problems = input_problems(load_config("h100", overrides, check_paths=False))
    return next(p for p in problems if p.startswith(f"{key}="))


@pytest.mark.parametrize("family, folder, repo", [
    ("cogvideox", "/models/CogVideoX-5b", "THUDM/CogVideoX-5b"),
    ("cogvideox", "/models/CogVideoX-2b/vae", "THUDM/CogVideoX-2b"),
    ("wan", "/models/Wan2.2", "Wan-AI/Wan2.2-TI2V-5B-Diffusers"),
    ("wan", "/models/wan2.2-t2v-a14b", "Wan-AI/Wan2.2-T2V-A14B-Diffusers"),
    ("wan", "/models/Wan2.1-14B", "Wan-AI/Wan2.1-T2V-14B-Diffusers"),
    ("wan", "/models/video_vae", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"),  # nothing in the name: the family's default
    ("hunyuan1_5", "/models/HunyuanVideo-1.5-i2v", "hunyuanvideo-community/HunyuanVideo-1.5-480p_i2v"),
])
def test_the_reference_vae_hint_downloads_the_model_the_folder_names(family, folder, repo):
    problem = problem_for("ref_vae_path", [f"ref_vae_family={family}", f"ref_vae_path={folder}", "model_variant=auto",
                                           "pretrained_model_path="])
    assert f"hf download {repo} --include 'vae/*' --local-dir {folder}" in problem, problem
    assert hub_repo_for(family, folder) == repo


def test_a_folder_named_for_another_family_says_so():
    problem = problem_for("ref_vae_path", ["ref_vae_path=/models/Wan2.2-TI2V-5B", "pretrained_model_path="])
    assert "hf download THUDM/CogVideoX-2b" in problem  # the family given (cogvideox, the default) ...
    assert ("its name suggests the wan family: with ref_vae_family=wan (or auto), hf download "
            "Wan-AI/Wan2.2-TI2V-5B-Diffusers --include 'vae/*' --local-dir /models/Wan2.2-TI2V-5B") in problem  # ... and the one the name says
    assert "suggests" not in problem_for("ref_vae_path", ["ref_vae_path=/models/CogVideoX-5b", "pretrained_model_path="])


def test_missing_public_weights_name_their_repository_and_the_command():
    problem = problem_for("pretrained_model_path", ["pretrained_model_path=checkpoints/taecvx.pth"])
    command = "curl -L --create-dirs -o checkpoints/taecvx.pth https://github.com/madebyollin/taehv/raw/main/taecvx.pth"
    assert "madebyollin/taehv" in problem and command in problem, problem
    # a file under another name: the run's student's public file, and the setting that points at it
    other = problem_for("pretrained_model_path", ["pretrained_model_path=/weights/mine.pth"])
    assert "-o checkpoints/taecvx.pth https://github.com/madebyollin/taehv/raw/main/taecvx.pth" in other
    assert "then --set pretrained_model_path=checkpoints/taecvx.pth" in other
    assert taehv_weights_url("taew2_2", ".safetensors") == "https://github.com/madebyollin/taehv/raw/main/safetensors/taew2_2.safetensors"
    assert taehv_weights_url("taeh3") == ""
    assert set(PUBLIC_TAEHV_BRANCHES) <= set(__import__("models.variants", fromlist=["VARIANTS"]).VARIANTS)


def test_missing_lpips_files_name_where_each_comes_from(tmp_path, monkeypatch):
    from models.metrics import BACKBONE_FILE, HEADS_FILE

    assert list(LPIPS_FILES) == [BACKBONE_FILE, HEADS_FILE]
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    problem = problem_for("perceptual_weight", ["pretrained_model_path="])
    checkpoints = tmp_path / "torch_home" / "hub" / "checkpoints"
    for name, (_, url) in LPIPS_FILES.items():
        assert f"curl -L --create-dirs -o {checkpoints / name} {url}" in problem, problem
    given = problem_for("lpips_weights_path", ["pretrained_model_path=", f"lpips_weights_path={tmp_path / 'heads.pth'}"])
    assert f"-o {tmp_path / 'heads.pth'} {LPIPS_FILES[HEADS_FILE][1]}" in given
    # the printed command is a command: curl with its output path and one URL
    words = shlex.split(problem.rpartition("heads: ")[2])
    assert words[:4] == ["curl", "-L", "--create-dirs", "-o"] and words[5].startswith("https://") and len(words) == 6


def test_every_family_with_a_public_pipeline_names_it_by_default():
    assert all(hub_repo_for(f.name, "/models/x") == (f.hub_repos[0] if f.hub_repos else "") for f in FAMILY_RECORDS)
    probe = "import sys, models.public_files, models.reference_families; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=REPO_ROOT)


def test_inference_says_where_the_missing_lpips_files_come_from(tmp_path):
    """inference.py's report names the commands beside the reason LPIPS is unavailable (a model and
    a clip made here: no training run)."""
    import json

    import torch
    from test_inference import run_inference

    from models.taehv import TAEHV
    from training.data.synthetic_clips import make_sample_videos

    make_sample_videos(tmp_path / "videos", count=1, n_frames=8)
    torch.manual_seed(0)
    torch.save(TAEHV("taehv").state_dict(), tmp_path / "taehv.pth")
    result = run_inference("--model", tmp_path / "taehv.pth", "--videos", tmp_path / "videos", "--frames", "8", "--height", "32",
                           "--width", "32", "--no-media", "--out", tmp_path / "out", torch_home=tmp_path / "torch_home")
    assert result.returncode == 0, result.stderr
    reason = json.loads((tmp_path / "out" / "report.json").read_text())["lpips_unavailable"]
    for name, (_, url) in LPIPS_FILES.items():
        assert f"curl -L --create-dirs -o {tmp_path / 'torch_home' / 'hub' / 'checkpoints' / name} {url}" in reason, reason
