"""Old-style `args = EasyDict()` config files: read through `custom`, converted by
scripts/convert_config.py, and launched (dry run)."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("easydict", reason="easydict (requirements.txt) is what old-style config files import")

from conftest import REPO_ROOT, free_port  # noqa: E402

from models.metrics import save_random_lpips_weights  # noqa: E402
from models.taehv import TAEHV  # noqa: E402
from training.config.legacy import legacy_overrides  # noqa: E402
from training.config.load import load_config, profile_overrides  # noqa: E402
from training.config.schema import ConfigError  # noqa: E402

LAUNCHER = str(REPO_ROOT / "train_taehv_h100.sh")
CONVERTER = str(REPO_ROOT / "scripts" / "convert_config.py")


def write_old_config(path: Path, values: dict) -> Path:
    lines = ["from easydict import EasyDict", "", "args = EasyDict()"]
    lines += [f"args.{key} = {value!r}" for key, value in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict:
    """Files and folders the old config points at (the path checks need them to exist)."""
    root = tmp_path_factory.mktemp("legacy")
    (root / "videos").mkdir()
    (root / "CogVideoX-2b" / "vae").mkdir(parents=True)
    (root / "CogVideoX-2b" / "vae" / "config.json").write_text("{}")  # the dry run checks the folder holds a VAE
    (root / "annotations.json").write_text("[]")
    torch.save(TAEHV("taecvx").state_dict(), root / "taecvx.pth")
    backbone, heads = save_random_lpips_weights(root / "lpips")
    return {"root": root, "lpips_backbone_path": str(backbone), "lpips_weights_path": str(heads)}


@pytest.fixture
def old_values(stand_ins) -> dict:
    """Every mapped old key, with values that differ from the base values where it can."""
    root = stand_ins["root"]
    return dict(
        train_batch_size=2, gradient_accumulation_steps=8, learning_rate=3e-4,
        reconstruction_loss_weight=5.0, encoder_loss_weight=0.2, decoder_loss_weight=0.3,
        perceptual_loss_weight=0.05, seraena_loss_weight=0.4, use_seraena=True,
        early_stopping_patience=7, metric_for_best_model="ssim", num_validation_samples=12,
        validation_batch_size=3, height=256, width=384, n_frames=12, use_ref_vae=True,
        cogvideox_model_path=str(root / "CogVideoX-2b"), pretrained_model_path=str(root / "taecvx.pth"),
        data_root=str(root / "videos"), annotation_file=str(root / "annotations.json"),
        dataloader_num_workers=4, checkpointing_steps=500, resume_from_checkpoint="latest",
        mixed_precision="bf16", max_train_steps=20000, lr_warmup_steps=300, lr_scheduler="linear",
        seed=1234, output_dir=str(root / "old_run"), gradient_checkpointing=True, max_grad_norm=0.5,
        nccl_timeout=5400, report_to="tensorboard", logging_dir="logs", tracker_project_name="taehv",
        adam_weight_decay=None,  # None: not set, the base value stays
        validation_steps=250,  # a key whose name did not change
        lpips_backbone_path=stand_ins["lpips_backbone_path"], lpips_weights_path=stand_ins["lpips_weights_path"],
    )


EXPECTED = dict(  # new key: the value it gets from old_values
    batch_size_per_gpu=2, gradient_accumulation_steps=8, learning_rate=3e-4, reconstruction_weight=5.0,
    encoder_weight=0.2, decoder_weight=0.3, perceptual_weight=0.05, seraena_weight=0.4,
    early_stopping_patience=7, best_metric="ssim", validation_samples=12, validation_batch_size=3,
    height=256, width=384, n_frames=9, use_ref_vae=True, ref_vae_family="cogvideox", num_workers=4,
    checkpointing_steps=500, mixed_precision="bf16", max_steps=20000, warmup_steps=300, lr_scheduler="linear",
    seed=1234, gradient_checkpointing=True, max_grad_norm=0.5, nccl_timeout_s=5400, weight_decay=0.01,
    validation_steps=250,
)
EXPECTED_PATHS = dict(ref_vae_path="CogVideoX-2b", pretrained_model_path="taecvx.pth", data_root="videos",
                      index_path="annotations.json", output_dir="old_run")


def assert_mapped(resolved: dict, root: Path) -> None:
    assert {key: resolved[key] for key in EXPECTED} == EXPECTED
    assert {key: resolved[key] for key in EXPECTED_PATHS} == {k: str(root / v) for k, v in EXPECTED_PATHS.items()}


def test_every_old_key_lands_in_the_resolved_config(tmp_path, old_values, stand_ins):
    old = write_old_config(tmp_path / "old.py", old_values)
    config = load_config(str(old), num_processes=8)
    assert_mapped(config.to_dict(), stand_ins["root"])
    assert config.global_batch_size == 2 * 8 * 8 and config.zero_stage == 2
    notes = []
    profile_overrides(str(old), notes)
    assert "n_frames=12 -> 9 (cogvideox needs 8k+1; 9 is the largest valid count not above 12, so no more memory)" in notes
    assert "train_batch_size=2 -> batch_size_per_gpu=2 (clips per process per micro-step, as before)" in notes
    assert any(note.startswith("resume_from_checkpoint='latest' not applied (a launcher option") for note in notes)
    assert "mixed_precision='bf16' not applied (comes from accelerate_config 'deepspeed_8gpu.yaml', which has it)" in notes
    assert any(note.startswith("report_to='tensorboard' not applied") for note in notes)


def test_any_process_count_with_a_derived_global_batch(tmp_path, old_values):
    old = write_old_config(tmp_path / "old.py", old_values)
    for processes in (1, 3, 8, 64):
        config = load_config(str(old), num_processes=processes, check_paths=False)
        assert config.global_batch_size == 2 * processes * 8


def test_switches_and_argument_forms():
    overrides, notes = legacy_overrides({"use_seraena": False, "seraena_loss_weight": 0.4, "n_frames": 12,
                                         "use_ref_vae": False, "max_train_steps": 1e4})
    assert overrides["seraena_weight"] == 0.0 and overrides["max_steps"] == 10000
    assert overrides["n_frames"] == 12  # autoencoder mode: multiples of 4, 12 is valid
    assert any(note.startswith("use_seraena=False -> seraena_weight=0.0") for note in notes)
    wan, notes = legacy_overrides(SimpleNamespace(n_frames=12, ref_vae_family="wan", height=None))
    assert wan["n_frames"] == 9 and "height" not in wan
    assert "n_frames=12 -> 9 (wan needs 4k+1" in notes[0]
    with pytest.raises(ConfigError, match=r"args.train_batch_size and args.batch_size_per_gpu both set batch_size_per_gpu"):
        legacy_overrides({"train_batch_size": 2, "batch_size_per_gpu": 4})


def test_unknown_keys_are_named_with_suggestions(tmp_path):
    old = write_old_config(tmp_path / "old.py", {"learnig_rate": 1e-4, "train_batch_sise": 2, "foo_bar_baz": 1, "seed": 1})
    with pytest.raises(ConfigError) as error:
        load_config(str(old), check_paths=False)
    message = str(error.value)
    assert "unknown keys in args: learnig_rate (did you mean learning_rate or " in message
    assert "train_batch_sise (did you mean train_batch_size or " in message
    assert "foo_bar_baz (no similar key)" in message and "seed" not in message.split("args:")[1]
    assert "\n" not in message


def test_mixed_precision_must_match_the_accelerate_file(tmp_path):
    old = write_old_config(tmp_path / "old.py", {"mixed_precision": "no"})
    with pytest.raises(ConfigError) as error:
        load_config(str(old), check_paths=False)
    assert ("mixed_precision='no' differs from 'bf16' of accelerate_config 'deepspeed_8gpu.yaml'" in str(error.value)
            and "(ddp_cpu.yaml, deepspeed_cpu.yaml, deepspeed_zero3_cpu.yaml)" in str(error.value))
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"mixed_precision='fp16' .* \(none; add one\)"):
        legacy_overrides({"mixed_precision": "fp16"})
    matching = write_old_config(tmp_path / "cpu.py", {"mixed_precision": "no", "accelerate_config": "ddp_cpu.yaml"})
    assert load_config(str(matching), check_paths=False).mixed_precision == "no"


def test_converted_module_resolves_to_the_same_config(tmp_path, old_values):
    old = write_old_config(tmp_path / "old.py", old_values)
    new = tmp_path / "my_run.py"
    converted = subprocess.run([sys.executable, CONVERTER, str(old), "-o", str(new)], capture_output=True, text=True)
    assert converted.returncode == 0, converted.stderr
    text = new.read_text()
    assert str(old) in text.split('"""')[1] and "overrides = dict(" in text
    assert "    batch_size_per_gpu=2,  # old train_batch_size\n" in text
    assert "    n_frames=9,  # old n_frames=12 (cogvideox needs 8k+1" in text
    assert "# not applied: resume_from_checkpoint='latest'" in text
    for processes in (1, 8):
        assert (load_config(str(new), num_processes=processes).to_dict()
                == load_config(str(old), num_processes=processes).to_dict())
    again = subprocess.run([sys.executable, CONVERTER, str(old), "-o", str(new)], capture_output=True, text=True)
    assert again.returncode == 2 and "exists; pass --force" in again.stderr and new.read_text() == text
    forced = subprocess.run([sys.executable, CONVERTER, str(old), "-o", str(new), "--force"], capture_output=True, text=True)
    assert forced.returncode == 0 and new.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_run.py", "old.py"]  # no temporary file left


def test_launcher_dry_run_of_an_old_config(tmp_path, old_values, stand_ins):
    import json

    old = write_old_config(tmp_path / "old.py", old_values)
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    result = subprocess.run([LAUNCHER, "8", "custom", str(old), "--dry-run"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("legacy config: n_frames=12 -> 9") == 1  # said once, not once per resolution
    assert "global batch     128" in result.stdout and "(ZeRO 2, bf16)" in result.stdout
    resolved = json.loads(result.stdout.split("resolved config:\n", 1)[1].split("\n}\n", 1)[0] + "}")
    assert_mapped(resolved, stand_ins["root"])  # output_dir included: the launcher runs in the file's run folder
    assert resolved["num_processes"] == 8 and f"run folder       {resolved['output_dir']}" in result.stdout
    assert not Path(resolved["output_dir"]).exists()  # a dry run writes nothing

    typo = write_old_config(tmp_path / "typo.py", {**old_values, "lr_warmup_step": 100})
    result = subprocess.run([LAUNCHER, "8", "custom", str(typo), "--dry-run"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unknown keys in args: lr_warmup_step (did you mean lr_warmup_steps" in result.stderr


def test_an_old_file_cannot_name_a_base_profile(tmp_path):
    old = write_old_config(tmp_path / "old.py", {"seed": 1})
    old.write_text(old.read_text() + 'base_profile = "a800"\n')
    with pytest.raises(ConfigError, match="an old-style `args` file starts from the base values; drop base_profile"):
        load_config(str(old), check_paths=False)
