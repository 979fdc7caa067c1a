"""chroma_pool: the chroma term on each cell's mean colour (issue 61), not on each pixel's."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from models.metrics import ycbcr
from models.taehv import TAEHV
from training.config.schema import TrainConfig
from training.config.terms import WEIGHT_KEYS
from training.step.losses import TERM_LOSSES, Student, compute_losses

chroma = TERM_LOSSES["chroma"]


def config(**keys):
    base = dict(dict.fromkeys(WEIGHT_KEYS, 0.0), chroma_weight=1.0, pixel_loss="mse", lpips_bf16=False, mixed_precision="no")
    return dataclasses.replace(TrainConfig(), **{**base, **keys})


def cell_mean_chroma(video: torch.Tensor, cell: int) -> torch.Tensor:
    """By hand: each frame's Cb and Cr, each cell x cell block replaced by its mean."""
    n, t, _, h, w = video.shape
    cbcr = ycbcr(video)[:, :, 1:]
    return cbcr.reshape(n, t, 2, h // cell, cell, w // cell, cell).mean(dim=(4, 6))


def test_default_is_the_per_pixel_chroma_term():
    assert TrainConfig().chroma_pool == 1
    torch.manual_seed(0)
    decoded, video = torch.rand(2, 4, 3, 16, 16), torch.rand(2, 4, 3, 16, 16)
    expected = F.mse_loss(ycbcr(decoded)[:, :, 1:], ycbcr(video)[:, :, 1:])
    assert chroma(config(), decoded, video, None, None).item() == pytest.approx(expected.item(), rel=1e-6)


def test_pooled_term_is_the_error_of_each_cells_mean_colour():
    torch.manual_seed(0)
    decoded, video = torch.rand(2, 4, 3, 16, 24), torch.rand(2, 4, 3, 16, 24)
    expected = F.mse_loss(cell_mean_chroma(decoded, 8), cell_mean_chroma(video, 8))
    assert chroma(config(chroma_pool=8), decoded, video, None, None).item() == pytest.approx(expected.item(), rel=1e-5)


def test_pooled_term_ignores_colour_detail_within_a_cell_and_keeps_a_cells_colour_shift():
    torch.manual_seed(0)
    video = torch.rand(1, 4, 3, 16, 16) * 0.5 + 0.25
    checker = (torch.arange(16).view(16, 1) + torch.arange(16).view(1, 16)) % 2 * 2 - 1.0  # zero mean in every 8x8 cell
    detail = video.clone()
    detail[:, :, 0] += 0.1 * checker  # red changes pixel by pixel, each cell's mean colour stays
    shifted = video.clone()
    shifted[:, :, 2, :8, :8] += 0.1  # one cell bluer
    assert chroma(config(), detail, video, None, None).item() > 1e-4
    assert chroma(config(chroma_pool=8), detail, video, None, None).item() < 1e-10
    assert chroma(config(chroma_pool=8), shifted, video, None, None).item() > 1e-4


def test_pooled_term_trains_the_round_trip_and_a_bad_factor_is_refused():
    torch.manual_seed(0)
    video = torch.rand(1, 8, 3, 32, 32)
    student = Student(TAEHV("taehv"))
    keys = dict(reconstruction_weight=0.0, encoder_weight=0.0, decoder_weight=0.0, chroma_weight=3.0, chroma_pool=8)
    loss, logged = compute_losses(config(**keys), student, video, None, None)
    with torch.no_grad():
        decoded = student.taehv.decode_video(student.taehv.encode_video(video))
    expected = F.mse_loss(cell_mean_chroma(decoded, 8), cell_mean_chroma(video[:, : decoded.shape[1]], 8))
    assert logged["chroma"].item() == pytest.approx(expected.item(), rel=1e-4)
    loss.backward()
    assert student.taehv.encoder[0].weight.grad.abs().sum() > 0
    from training.config.load import load_config
    from training.config.schema import ConfigError

    with pytest.raises(ConfigError, match="chroma_pool=0 must be at least 1"):  # refused before any work
        load_config("test", ["chroma_pool=0"], 1, check_paths=False)
