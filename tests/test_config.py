import json

import pytest
from conftest import REPO_ROOT

from training.config.docs import configuration_markdown
from training.config.inputs import input_problems
from training.config.load import available_profiles, load_config, write_resolved_config
from training.config.schema import SETTABLE_KEYS, ConfigError

PRODUCTION = {"1gpu_h100": 1, "h100": 8, "16gpu_h100": 16, "64gpu_h100": 64, "a800": 8}


def test_every_profile_resolves_for_each_supported_process_count():
    assert set(PRODUCTION) | {"cpu", "test"} <= set(available_profiles())
    for profile in available_profiles():
        supported = load_config(profile, check_paths=False).supported_num_gpus
        for processes in supported:
            config = load_config(profile, num_processes=processes, check_paths=False)
            assert config.global_batch_size == config.batch_size_per_gpu * processes * config.gradient_accumulation_steps


def test_production_profiles_have_the_values_users_run():
    expected = {  # profile: (processes, ZeRO, batch/GPU, accumulation, global batch, LR, NCCL timeout)
        "1gpu_h100": (1, 0, 4, 32, 128, 1e-4, 1800),  # one process, no ZeRO (the profile says why)
        "h100": (8, 0, 4, 4, 128, 1e-4, 3600),  # 8 clips per micro-step measure 84 GB (training/plan/memory.py)
        "16gpu_h100": (16, 0, 4, 2, 128, 1e-4, 7200),
        "64gpu_h100": (64, 0, 4, 1, 256, 2e-4, 14400),
        "a800": (8, 0, 2, 8, 128, 1e-4, 3600),
    }
    for profile, values in expected.items():
        c = load_config(profile, check_paths=False)
        got = (c.num_processes, c.zero_stage, c.batch_size_per_gpu, c.gradient_accumulation_steps,
               c.global_batch_size, c.learning_rate, c.nccl_timeout_s)
        assert got == values, profile
        assert (c.height, c.width, c.mixed_precision, c.reconstruction_weight, c.seraena_weight) == (480, 720, "bf16", 10.0, 0.1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["n_frame=13"], "n_frame: unknown config key; did you mean 'n_frames'"),
        (["learning_rate=fast"], "learning_rate=fast: expected float"),
        (["max_steps=1.5"], "max_steps=1.5: expected int"),
        (["use_ref_vae=maybe"], "use_ref_vae=maybe: expected bool"),
        (["n_frames=12"], "n_frames=12 gives no whole latent frame count for the cogvideox reference VAE (needs 8k+1): use 9 or 17"),
        (["n_frames=12", "ref_vae_family=wan"], "for the wan reference VAE (needs 4k+1): use 9 or 13"),
        (["height=470"], "height=470 must be a positive multiple of 8"),
        (["global_batch_size=64"], "global_batch_size=64 but batch_size_per_gpu 4 x processes 8 x gradient_accumulation_steps 4 = 128"),
        (["checkpointing_steps=200000"], "checkpointing_steps=200000 exceeds max_steps=100000"),
        (["ref_vae_family=sdxl"], "ref_vae_family='sdxl': choose auto or one of cogvideox, hunyuan, hunyuan1_5, wan, ltx, ltx2, minimax_h3"),
        (["use_ref_vae=false"], "autoencoder mode"),
        (["model_variant=taehv1_5", "height=472"], "multiple of 16 for taehv1_5"),
        (["zero_stage=3"], "derived key"),
        (["perceptual_weight=-1"], "perceptual_weight=-1.0 must not be negative"),
        (["temporal_weight=-1"], "temporal_weight=-1.0 must not be negative"),
        (["best_metric=flicker_psnr"], "best_metric='flicker_psnr': choose one of psnr, ssim, lpips, flicker, decode_psnr"),
        (["sample_data=yes"], "sample_data='yes': choose one of , real, synthetic"),
        (["ref_vae_latent_space=normalized"], "ref_vae_latent_space='normalized' is not available for the cogvideox VAE: "
                                               "choose auto or one of raw, scaled"),
        (["ref_vae_latent_space=latent"], "ref_vae_latent_space='latent': choose auto, raw, scaled, normalized"),
        (["use_ref_vae=false", "encoder_weight=0", "decoder_weight=0", "seraena_weight=0", "n_frames=4"],
         "n_frames=4 gives 1 latent frame: the decoder's temporal layers would not train; use 8 or more "
         "(or set image_only=true for an image autoencoder)"),
    ],
)
def test_bad_values_fail_with_the_key_named(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config("h100", overrides, check_paths=False)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_one_latent_frame_trains_only_when_image_only_says_so():
    image = load_config("cpu", ["n_frames=4", "image_only=true"], 1, check_paths=False)
    assert image.latent_frames == 1
    for temporal in ("temporal_weight=0.1", "best_metric=flicker"):  # one decoded frame has no frame-to-frame change
        with pytest.raises(ConfigError, match=f"{temporal}.* compares consecutive frames, n_frames=4 gives 1 decoded frame"):
            load_config("cpu", ["n_frames=4", "image_only=true", temporal], 1, check_paths=False)
    assert load_config("cpu", ["temporal_weight=0.1", "best_metric=flicker"], 1, check_paths=False).temporal_weight == 0.1
    for profile in ("cpu", "test"):  # the embedded defaults train every temporal slot
        assert load_config(profile, [], 1, check_paths=False).latent_frames >= 2


def vae_folder(tmp_path):
    (tmp_path / "vae").mkdir(exist_ok=True)
    (tmp_path / "vae" / "config.json").write_text("{}")
    return tmp_path


def test_perceptual_weight_needs_the_lpips_files_up_front(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_hub"))
    common = ["pretrained_model_path=", f"ref_vae_path={vae_folder(tmp_path)}", f"data_root={tmp_path}"]
    with pytest.raises(ConfigError, match=r"perceptual_weight=0.1 needs LPIPS weights: LPIPS AlexNet backbone .* not found at .*empty_hub"):
        load_config("h100", common)
    assert load_config("h100", common + ["perceptual_weight=0"]).perceptual_weight == 0
    from models.metrics import save_random_lpips_weights

    backbone, heads = save_random_lpips_weights(tmp_path / "lpips")
    config = load_config("h100", common + [f"lpips_backbone_path={backbone}", f"lpips_weights_path={heads}"])
    assert config.perceptual_weight == 0.1


def test_wrong_process_count_and_missing_paths_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"written for 8 process\(es\), got 1: use the profile 1gpu_h100"):
        load_config("h100", num_processes=1, check_paths=False)
    with pytest.raises(ConfigError, match=r"written for 1 process\(es\), got 8: use the profile h100"):
        load_config("1gpu_h100", num_processes=8, check_paths=False)
    with pytest.raises(ConfigError, match="pretrained_model_path='checkpoints/taecvx.pth' does not exist"):
        load_config("h100")
    with pytest.raises(ConfigError, match=r"data_root='/nonexistent' is not a folder"):
        load_config("h100", ["pretrained_model_path=", f"ref_vae_path={vae_folder(tmp_path)}", "data_root=/nonexistent",
                             "perceptual_weight=0"])
    with pytest.raises(ConfigError, match="ref_vae_path='./missing' is not a local folder: put the diffusers cogvideox pipeline in a local folder and set ref_vae_path to it \(e.g. hf download THUDM/CogVideoX-2b --include 'vae/\*' --local-dir ./missing\)"):
        load_config("h100", ["pretrained_model_path=", f"data_root={tmp_path}", "ref_vae_path=./missing"])
    with pytest.raises(ConfigError, match=r"ref_vae_path='someone/missing-vae' is no local folder and not in the Hugging Face "
                                          r"cache: .* \(hf download someone/missing-vae --include 'vae/\*'\)"):
        load_config("h100", ["pretrained_model_path=", f"data_root={tmp_path}", "ref_vae_path=someone/missing-vae"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"ref_vae_path='.*empty' holds no config.json \(nor vae/config.json\)"):
        load_config("h100", ["pretrained_model_path=", f"data_root={tmp_path}", f"ref_vae_path={tmp_path / 'empty'}"])


def test_every_missing_input_is_listed_with_its_fix(tmp_path, monkeypatch):
    """What the dry run prints for a bare machine: all of them, not the first; a launch names the first and the count."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_hub"))
    bare = [f"pretrained_model_path={tmp_path / 'taecvx.pth'}", f"ref_vae_path={tmp_path / 'CogVideoX-2b'}",
            f"data_root={tmp_path / 'videos'}", f"index_path={tmp_path / 'index.jsonl'}"]
    problems = input_problems(load_config("h100", bare, check_paths=False))
    expected = ["pretrained_model_path=", "ref_vae_path=", "data_root=", "index_path=", "perceptual_weight=0.1 needs LPIPS"]
    assert [next(e for e in expected if p.startswith(e)) for p in problems] == expected, problems
    assert all(": " in p and "\n" not in p for p in problems)  # each names its fix after the colon, on one line
    with pytest.raises(ConfigError, match=r"pretrained_model_path=.* does not exist: .* \(and 4 more: --dry-run lists them all\)"):
        load_config("h100", bare)


def test_custom_file_with_base_profile(tmp_path):
    custom = tmp_path / "my_run.py"
    custom.write_text('base_profile = "a800"\noverrides = dict(learning_rate=5e-5, max_steps=5000)\n')
    config = load_config(str(custom), check_paths=False)
    assert (config.learning_rate, config.max_steps, config.batch_size_per_gpu) == (5e-5, 5000, 2)
    typo = tmp_path / "typo.py"
    typo.write_text("overrides = dict(learnig_rate=1e-4)\n")
    with pytest.raises(ConfigError, match="unknown config key 'learnig_rate'; did you mean 'learning_rate'"):
        load_config(str(typo), check_paths=False)
    wrong_type = tmp_path / "wrong_type.py"
    wrong_type.write_text("overrides = dict(max_steps='1000')\n")
    with pytest.raises(ConfigError, match="max_steps='1000' has type str, expected int"):
        load_config(str(wrong_type), check_paths=False)
    with pytest.raises(ConfigError, match="unknown profile or missing config file 'h200'"):
        load_config("h200")


def test_resolved_config_round_trips(tmp_path):
    config = load_config("test", ["output_dir=x"], num_processes=2, check_paths=False)
    path = write_resolved_config(config, tmp_path)
    saved = json.loads(path.read_text())
    assert saved["num_processes"] == 2 and saved["global_batch_size"] == 2 and saved["zero_stage"] == 0  # plain DDP: no compiler needed
    assert set(saved) >= set(SETTABLE_KEYS)


def test_configuration_doc_is_current():
    document = (REPO_ROOT / "docs" / "configuration.md").read_text()
    assert document == configuration_markdown(), "run: python -m training.plan --markdown > docs/configuration.md"


def test_a_data_root_the_user_names_gets_no_sample_clips(tmp_path):
    """The cpu and test profiles make sample clips into their own folder; a data_root set with --set
    or by a config file on such a base is the user's (a typo is then 'not a folder', not a new
    folder of demo clips), unless the same layer asks for sample_data."""
    assert load_config("test", [], check_paths=False).sample_data == "real"
    assert load_config("test", [f"data_root={tmp_path}"]).sample_data == ""
    assert load_config("test", [f"data_root={tmp_path}", "sample_data=synthetic"]).sample_data == "synthetic"
    # the profile's held-out source names its own clips' source: another folder is split by path
    assert load_config("test", [], check_paths=False).validation_sources == "carphone_pristine.mp4"
    assert load_config("test", [f"data_root={tmp_path}"]).validation_sources == ""
    assert load_config("test", [f"data_root={tmp_path}", "validation_sources=x.mp4"]).validation_sources == "x.mp4"
    with pytest.raises(ConfigError, match=r"data_root='.*/typo' is not a folder"):
        load_config("test", [f"data_root={tmp_path / 'typo'}"])
    custom = tmp_path / "mine.py"
    custom.write_text(f'base_profile = "cpu"\noverrides = dict(data_root={str(tmp_path)!r})\n')
    assert load_config(str(custom), []).sample_data == ""


def test_the_storage_retry_window_stays_inside_the_step_timeout():
    """A rank waiting on object storage reaches the step's agreement only when its retries end: with
    a window as long as step_timeout_s, the others would stop the job as if it were dead."""
    remote = ["data_root=s3://clips/videos"]
    config = load_config("test", remote, check_paths=False)  # the defaults
    assert config.storage_retry_s * 2 <= config.step_timeout_s
    with pytest.raises(ConfigError, match=r"storage_retry_s=600 must be at most half of step_timeout_s=600"):
        load_config("test", remote + ["storage_retry_s=600"], check_paths=False)
    assert load_config("test", remote + ["storage_retry_s=600", "step_timeout_s=1200"], check_paths=False).storage_retry_s == 600
    assert load_config("test", ["storage_retry_s=600"], check_paths=False).storage_retry_s == 600  # a local folder: no store


def test_key_lists_are_derived_from_the_tags_of_existing_keys():
    """RESUME_MAY_CHANGE, STAGE_FIXED_KEYS, the measurement cache keys, the 1:1 legacy names and the
    launcher's shell variables come from option(..., tag=...) in schema.py: each names a real key,
    and the keys that matter for each list carry its tag."""
    import dataclasses
    import re

    from training.config.legacy import LEGACY_KEYS, LEGACY_SPECIAL
    from training.config.load import STAGE_FIXED_KEYS
    from training.config.schema import DERIVED_KEYS, FIELD_TYPES, TrainConfig, measured_keys, tagged
    from training.plan.memory import MEASURED_KEYS  # torch: imported here, not for the whole file
    from training.run.folder import RESUME_MAY_CHANGE

    assert all("measured" in f.metadata for f in dataclasses.fields(TrainConfig)), "declare every key with option()"
    assert RESUME_MAY_CHANGE <= set(SETTABLE_KEYS) and STAGE_FIXED_KEYS <= set(SETTABLE_KEYS)
    # a resume may extend the run, retune its loaders and limits, and convert its topology (training/run/elastic.py) ...
    assert {"max_steps", "num_workers", "nccl_timeout_s", "gradient_checkpointing", "supported_num_gpus",
            "accelerate_config", "batch_size_per_gpu", "gradient_accumulation_steps", "global_batch_size"} <= RESUME_MAY_CHANGE
    # ... and lower its learning rate (the fix for a loss gone non-finite: its schedule goes on with the new peak) ...
    assert "learning_rate" in RESUME_MAY_CHANGE
    # ... but not what the run learns: that is another run
    weights = {key for key in FIELD_TYPES if key.endswith("_weight")}
    assert len(weights) >= 6 and not (weights | {"data_root", "height", "width", "n_frames",
                                                 "model_variant", "ref_vae_path", "ref_vae_family"}) & RESUME_MAY_CHANGE
    assert {"stages", "stage", "max_steps", "model_variant"} <= STAGE_FIXED_KEYS
    # a cached measurement is stale when a key it depends on is missing: the losses, the clip, the model, the precision
    step = weights | {"batch_size_per_gpu", "n_frames", "height", "width", "student_args", "use_ref_vae",
                      "reference_family", "reference_geometry", "latent_cache"}
    assert step <= set(measured_keys("flops")) <= set(MEASURED_KEYS)  # the memory is measured on the same step
    assert {"zero_stage", "mixed_precision", "gradient_checkpointing", "train_encoder", "pixel_loss"} <= set(MEASURED_KEYS)
    # the legacy names: one old name per key, none also in the hand-written table, each to an existing key
    old_names = list(tagged("legacy").values())
    assert len(old_names) == len(set(old_names)) and not set(old_names) & set(LEGACY_SPECIAL)
    assert {"max_train_steps": "max_steps", "reconstruction_loss_weight": "reconstruction_weight"}.items() <= \
        {old: entry.new for old, entry in LEGACY_KEYS.items()}.items()
    for entry in LEGACY_KEYS.values():
        assert {key for key, _ in entry.also} | {entry.new} - {None} <= set(SETTABLE_KEYS) | DERIVED_KEYS
    # the shell variables: unique, and each read by the launcher
    launcher = (REPO_ROOT / "train_taehv_h100.sh").read_text()
    shell = list(tagged("shell").values())
    assert len(shell) == len(set(shell)) and all(re.search(rf"\b{name}\b", launcher) for name in shell)


@pytest.mark.parametrize(("profile", "processes", "accumulation", "global_batch"), [
    ("h100", 4, 8, 128), ("16gpu_h100", 32, 1, 128), ("16gpu_h100", 24, 1, 96), ("64gpu_h100", 128, 1, 512),
    ("a800", 16, 4, 128),
])
def test_a_multi_gpu_profile_fits_any_process_count(profile, processes, accumulation, global_batch):
    """Another count than the profile's keeps its global batch by accumulation where it divides, else the
    nearest, said in one note; a --set accumulation is kept and the batch derived from it."""
    notes: list[str] = []
    config = load_config(profile, num_processes=processes, check_paths=False, notes=notes)
    assert (config.gradient_accumulation_steps, config.global_batch_size) == (accumulation, global_batch)
    assert len(notes) == 1 and notes[0].startswith(f"{processes} processes (profile written for ")
    given = load_config(profile, ["gradient_accumulation_steps=3"], num_processes=processes, check_paths=False)
    assert given.global_batch_size == given.batch_size_per_gpu * processes * 3
