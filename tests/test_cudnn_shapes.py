"""cuDNN's autotuning (cudnn_benchmark) times every new input shape again, mid-run. So validation
feeds the models one shape (a short batch filled up with repeats that no metric counts), and under
aspect buckets, whose shapes come at random through the first epoch, autotuning is off
(docs/performance.md#cudnn-autotuning). Both are visible on the CPU: the shapes the models are
given, and the flag the run sets."""

from types import SimpleNamespace

import pytest
import torch

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
