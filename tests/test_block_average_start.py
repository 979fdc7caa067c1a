"""student_start=block_average: the student starts as the block-average codec (issue 61)."""

import pytest
import torch
import torch.nn.functional as F

from models.metrics import block_pool
from models.taehv import TAEHV
from models.taehv.block_average_start import start_as_block_average
from training.config.load import load_config
from training.config.schema import ConfigError


def block_average_start(video: torch.Tensor, patch: int) -> torch.Tensor:
    """Each frame's means of 8p x 8p cells, copied to the decoder's last size but one, then bilinear
    2x around mid-grey (the zero padding pulls border pixels a quarter of the way to grey), then
    each pixel to its p x p patch."""
    pooled = block_pool(video, 8 * patch).flatten(0, 1)
    copied = F.interpolate(pooled, scale_factor=8, mode="nearest") - 0.5
    kernel = torch.outer(torch.tensor([0.25, 0.5, 0.25]), torch.tensor([0.25, 0.5, 0.25])).expand(3, 1, 3, 3)
    smoothed = F.conv2d(copied, kernel, padding=1, groups=3) + 0.5
    return F.interpolate(smoothed, scale_factor=patch, mode="nearest").unflatten(0, video.shape[:2])


@pytest.mark.parametrize("variant", ["taehv", "taehv1_5"])  # 8x8 cells of 4 frames x RGB in 16 latent channels; 16x16 cells (patch 2)
def test_the_start_decodes_each_frame_as_its_own_cells_mean(variant):
    torch.manual_seed(0)
    model = TAEHV(variant).eval()
    start_as_block_average(model)
    # 3 latents: every slot of the leading-frame trim and of memory; each frame its own tint
    video = 0.5 * torch.rand(2, 12, 3, 1, 1) + 0.5 * torch.rand(2, 12, 3, 32, 48)
    with torch.no_grad():
        decoded = model.decode_video(model.encode_video(video))
        streamed = model.decode_video(model.encode_video(video, parallel=False), parallel=False)
    frames = decoded.shape[1]
    expected = block_average_start(video[:, :frames], model.patch_size)
    # the only departure: the decoder's input Clamp, 3 tanh(x / 3), on latents of at most 0.25
    assert (decoded - expected).abs().max().item() < 2.5e-3
    assert (streamed - decoded).abs().max().item() < 1e-5
    # and not by chance: another frame's cells are far off
    assert (decoded[:, 1:] - expected[:, :-1]).abs().max().item() > 0.1


def test_the_start_leaves_every_weight_trainable_with_random_channels_beside_the_path():
    torch.manual_seed(0)
    model = TAEHV("taehv")
    start_as_block_average(model)
    video = torch.rand(1, 8, 3, 32, 32)
    loss = (model(video) - video[:, :5]).square().mean()
    loss.backward()
    out = model.decoder[-1]
    assert out.weight.grad[:, 12:].abs().sum() > 0  # the output learns to read the random channels
    assert model.encoder[-1].weight[12:].abs().sum() > 0  # the 4 latent channels beyond the path start random


def test_the_config_refuses_it_where_the_latent_space_is_not_its_own():
    base = ["model_variant=taehv", "pretrained_model_path=", "use_ref_vae=false", "encoder_weight=0", "decoder_weight=0"]
    assert load_config("test", [*base, "student_start=block_average"], 1, check_paths=False).student_start == "block_average"
    with pytest.raises(ConfigError, match="^student_start=block_average makes its own latent space"):
        load_config("test", [*base, "student_start=block_average", "pretrained_model_path=checkpoints/taehv.pth"], 1,
                    check_paths=False)
    with pytest.raises(ConfigError, match="model_variant=taecvx: .*CogVideoX rule"):
        load_config("test", [*base, "student_start=block_average", "model_variant=taecvx"], 1, check_paths=False)
    with pytest.raises(ConfigError, match="student_start='blur': choose one of random, block_average"):
        load_config("test", [*base, "student_start=blur"], 1, check_paths=False)
