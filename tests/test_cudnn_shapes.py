"""cuDNN's autotuning (cudnn_benchmark) times every new input shape again, mid-run. So validation
feeds the models one shape (a short batch filled up with repeats that no metric counts), under
aspect buckets, whose shapes come at random through the first epoch, autotuning is off
(docs/performance.md#cudnn-autotuning), and every other shape a run meets is met before its first
optimizer step ends (the warm-ups). All are visible on the CPU: the shapes the models are given,
and the flag the run sets."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO_ROOT, free_port, needs_compiler

from models.taehv import TAEHV
from training.config.load import load_config
from training.config.views import student_of
from training.data.buckets import bucket_lines
from training.loop.build import configure_cuda
from training.loop.validation import validate


class Log:
    def __init__(self):
        self.lines = []

    def line(self, text):
        self.lines.append(text)


def test_validation_feeds_the_models_one_shape_and_counts_no_repeat():
    """5 held-out clips with cached latents (clip 3's not finite), batches of 2: every round trip and
    every decode of the latents gets 2 clips, the short batches filled with repeats, and the metrics
    and the skipped count are those of one clip at a time."""
    torch.manual_seed(0)
    config = load_config("test", ["use_ref_vae=true", "latent_cache=/cache", "n_frames=9", "validation_samples=5"],
                         1, check_paths=False)
    model = TAEHV(student_of(config)).eval()
    clips = []
    for number in range(5):
        video = (torch.rand(9, 3, 32, 32) * 255).to(torch.uint8)
        with torch.no_grad():
            latents = model.encode_video(video[None].float() / 255)[0]
        clips.append({"video": video, "latents": latents.fill_(float("nan")) if number == 3 else latents})
    shapes = []
    model.register_forward_pre_hook(lambda module, args: shapes.append(("round trip", tuple(args[0].shape))))
    decode = model.decode_video
    model.decode_video = lambda latents, *args, **kwargs: shapes.append(("decode", tuple(latents.shape))) or decode(
        latents, *args, **kwargs)
    results = {}
    for size in (2, 1):
        shapes.clear()
        run = SimpleNamespace(config=load_config("test", ["use_ref_vae=true", "latent_cache=/cache", "n_frames=9",
                                                          "validation_samples=5", f"validation_batch_size={size}"],
                                                 1, check_paths=False),
                              validation_dataset=clips, lpips=None, reference_vae=None, log=Log(),
                              accelerator=SimpleNamespace(process_index=0, num_processes=1, device=torch.device("cpu"),
                                                          is_main_process=False))
        results[size] = validate(run, model)
        if size == 2:
            # batches [0 1] [2 (3 skipped)] [4]: the round trip (its own decode inside), then the latents' decode
            assert shapes == [("round trip", (2, 9, 3, 32, 32)), ("decode", (2, 3, 16, 4, 4)), ("decode", (2, 3, 16, 4, 4))] * 3
            assert run.log.lines and "validation sample 3" in run.log.lines[0]
    assert results[2]["skipped_clips"] == results[1]["skipped_clips"] == 1
    assert results[2] == pytest.approx(results[1], rel=1e-5)


@pytest.mark.parametrize("sets, tuned", [([], True), (["buckets=24,40,40,24,32,32"], False),
                                         (["cudnn_benchmark=false"], False)])
def test_cudnn_autotunes_only_where_the_shapes_are_fixed(sets, tuned):
    """The flag the run sets (with or without CUDA: without, it does nothing): on for the fixed shapes
    of a run without buckets, off under buckets, with a line in the dry run saying why."""
    config = load_config("test", sets, 1, check_paths=False)
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = not tuned
        configure_cuda(config)
        assert torch.backends.cudnn.benchmark is tuned
    finally:
        torch.backends.cudnn.benchmark = before
    said = [line for line in bucket_lines(config) if "cudnn_benchmark" in line]
    assert said == (["cuDNN autotuning (cudnn_benchmark): off, each bucket's shape would be tuned again mid-run"]
                    if config.buckets else [])


@pytest.mark.slow
@needs_compiler
def test_no_convolution_shape_is_first_met_after_the_first_step(tmp_path):
    """A real launch (one process, the ZeRO-2 engine) whose run meets every kind of shape: steps pooled
    2x (half_size_every) with terms that start late (Seraena's at a pooled step), validation at its batch
    and at validation_sizes, the starting weights' baseline, all with cudnn.benchmark on. Every
    convolution of the whole run (forward, input and weight gradient, by shapes, dtypes and layout;
    tests/conv_shapes_run.py) is first met before the first optimizer step ends: the first micro-step
    warms the other scale on a twin of the student and the terms that start later, the loop warms
    validation's shapes before step 1. Before, 135 were first met later (the pooled student, Seraena at
    the pooled shape, validation's batch, SSIM's window and 64x64).
    The same run has max_grad_norm=0 (no clipping, as DeepSpeed reads gradient_clipping=0) and no
    weight decay: the exported weights moved from the starting ones, so the engine learned
    (tests/test_max_grad_norm.py: the one-process step)."""
    from safetensors.torch import load_file

    from models.taehv import TAEHV
    from training.data.synthetic_clips import make_sample_videos

    make_sample_videos(tmp_path / "clips", count=6, n_frames=24)
    torch.manual_seed(0)
    start = TAEHV("taehv").state_dict()
    (tmp_path / "start").mkdir()
    torch.save(start, tmp_path / "start" / "taehv.pth")
    run_dir = tmp_path / "run"
    sets = [f"data_root={tmp_path / 'clips'}", "accelerate_config=deepspeed_cpu.yaml", "half_size_every=2",
            "validation_sizes=64x64", "batch_size_per_gpu=2", "seraena_weight=0.1", "seraena_schedule=(3,0)",
            "temporal_weight=0.1", "temporal_schedule=(2,0)", "max_steps=4", "validation_steps=2", "checkpointing_steps=4",
            "max_grad_norm=0", "weight_decay=0", f"pretrained_model_path={tmp_path / 'start' / 'taehv.pth'}"]
    command = [sys.executable, "-m", "training.base.launch", "--config_file",
               str(REPO_ROOT / "accelerate_configs" / "deepspeed_cpu.yaml"), "--num_processes", "1", "--num_machines", "1",
               "--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
               str(REPO_ROOT / "tests" / "conv_shapes_run.py"), "--config", "test", "--output-dir", str(run_dir),
               *(arg for item in sets for arg in ("--set", item))]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    report = json.loads(result.stdout.rpartition("SHAPES ")[2] or "{}")
    assert report.get("exit_code") == 0, (result.stdout + result.stderr)[-4000:]
    assert report["seen"] > 100 and report["late"] == [], report["late"][:5]
    log = (run_dir / "train.log").read_text()
    assert "Starting weights" in log and "64x64_psnr" in log and "Step 4/4" in log  # every part of the run ran
    exported = load_file(next((run_dir / "final").glob("*.safetensors")))
    assert exported.keys() == start.keys() and any(not torch.equal(exported[k].float(), start[k]) for k in start)


@pytest.mark.parametrize("sets, dtype", [(["channels_last=true", "train_encoder=false",
                                           "pretrained_model_path=taehv.pth"], torch.float32), ([], torch.bfloat16)])
def test_the_students_twin_has_its_layouts_and_dtypes_and_its_warm_up_changes_nothing(sets, dtype, tmp_path, monkeypatch):
    """What cuDNN tunes a shape for is the tensors' dtypes and layouts: the twin the first micro-step warms
    the pooled steps on (losses.shape_twin) has each parameter's dtype, memory format (NHWC weights of
    the one-GPU profiles; a bf16 DeepSpeed engine's bf16 ones) and requires_grad, and the student's fast
    path; the warm-up leaves the student's weights and gradients and Seraena's state as they were."""
    from training.loop.build import build_model
    from training.step.losses import shape_twin, warm_scale
    from training.step.seraena import SeraenaState

    monkeypatch.chdir(tmp_path)
    torch.save(TAEHV("taehv").state_dict(), tmp_path / "taehv.pth")
    config = load_config("test", ["half_size_every=2", "seraena_weight=0.1", "batch_size_per_gpu=2", *sets], 1,
                         check_paths=False)
    student = build_model(config).to(dtype)
    twin = shape_twin(student)
    assert twin.taehv.channels_last == student.taehv.channels_last == config.channels_last
    for (name, mine), theirs in zip(twin.named_parameters(), student.parameters()):
        assert (mine.dtype, mine.stride(), mine.requires_grad) == (theirs.dtype, theirs.stride(), theirs.requires_grad), name
    assert any(not p.requires_grad for p in twin.parameters()) == ("train_encoder=false" in sets)
    seraena = SeraenaState(16, 1e-4, 4, seed=0, rank=0, device=torch.device("cpu"), amp_dtype=None)
    before = [t.clone() for t in [*student.state_dict().values(), *seraena.seraena.state_dict().values()]]
    warm_scale(config, twin, torch.rand(2, 8, 3, 16, 16), seraena, None)
    after = [*student.state_dict().values(), *seraena.seraena.state_dict().values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after)) and all(p.grad is None for p in student.parameters())
    assert len(seraena.seraena.buffer) == 0 and not seraena.seraena.optimizer.state
    assert all(p.grad is not None for p in twin.parameters() if p.requires_grad)  # its backward ran
