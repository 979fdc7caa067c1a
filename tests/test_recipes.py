"""Recipes users ask for (docs/training.md#recipes): decoder-only (or encoder-only) fine-tuning
of a public weight file, with the frozen part exported bit-equal."""

import pytest
import torch

from models.taehv import TAEHV
from training.builders import build_model, build_optimizer
from training.config import ConfigError, load_config
from training.distill import compute_losses


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
    from training.dataset import zoomed_cover

    # a 64x96 frame, 32x32 training crops: the largest square region has a 64 px side
    assert zoomed_cover(64, 96, 0, (32, 32), 0.0, 16) == (128, 128)  # a 16 px region, scaled up 2x
    assert zoomed_cover(64, 96, 0, (32, 32), 1.0, 16) == (32, 32)  # the whole 64 px region, as without augmentation
    assert zoomed_cover(64, 96, 0, (32, 32), 0.5, 16) == (52, 52)  # a 40 px region
    assert zoomed_cover(96, 64, 90, (32, 32), 0.0, 16) == (128, 128)  # stored rotated: the shown frame decides
    assert zoomed_cover(64, 96, 0, (32, 32), 0.3, 100) == (32, 32)  # the frame is smaller than the minimum: no zoom


def test_scale_augmented_training_clips_keep_their_size_and_differ_from_plain_crops(tmp_path):
    from scripts.make_sample_videos import make_sample_videos
    from training.dataset import ClipSpec, VideoClipDataset, read_index

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
