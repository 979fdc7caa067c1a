"""PSNR, SSIM, LPIPS, flicker, luma and chroma PSNR, colourfulness, warping error and the block
average (models/metrics.py) against independent computations and the published file layouts."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT

from models.metrics import (
    ALEX_CHANNELS,
    LPIPS,
    LPIPSUnavailable,
    block_average,
    block_pool,
    chroma_psnr,
    colourfulness,
    colourfulness_ratio,
    find_lpips_weights,
    flicker,
    load_lpips,
    luma_psnr,
    psnr,
    save_random_lpips_weights,
    source_warps,
    ssim,
    temporal_error,
    warping_error,
    ycbcr,
)


def numpy_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """Straight from the definition: 11x11 Gaussian windows (sigma 1.5), valid positions only,
    per channel, for one C,H,W image pair in [0, 1]."""
    g = np.exp(-((np.arange(11) - 5) ** 2) / (2 * 1.5**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = 0.01**2, 0.03**2
    scores = []
    for c in range(x.shape[0]):
        for i in range(x.shape[1] - 10):
            for j in range(x.shape[2] - 10):
                a, b = x[c, i : i + 11, j : j + 11], y[c, i : i + 11, j : j + 11]
                ma, mb = (w * a).sum(), (w * b).sum()
                va, vb = (w * a * a).sum() - ma**2, (w * b * b).sum() - mb**2
                cov = (w * a * b).sum() - ma * mb
                scores.append((2 * ma * mb + c1) * (2 * cov + c2) / ((ma**2 + mb**2 + c1) * (va + vb + c2)))
    return float(np.mean(scores))


def test_psnr_and_ssim_match_independent_computations():
    torch.manual_seed(0)
    clean = torch.rand(2, 3, 3, 24, 20)
    noisy = (clean + 0.05 * torch.randn_like(clean)).clamp(0, 1)
    mse = ((noisy - clean) ** 2).reshape(2, -1).mean(1)
    assert torch.allclose(psnr(noisy, clean), 10 * torch.log10(1 / mse))
    expected = np.mean([numpy_ssim(noisy[1, t].numpy().astype(np.float64), clean[1, t].numpy().astype(np.float64))
                        for t in range(3)])
    assert ssim(noisy, clean)[1].item() == pytest.approx(expected, abs=1e-5)
    assert torch.allclose(ssim(clean, clean), torch.ones(2))
    worse = (clean + 0.2 * torch.randn_like(clean)).clamp(0, 1)
    assert (ssim(worse, clean) < ssim(noisy, clean)).all()


def test_flicker_is_zero_when_the_reconstruction_changes_as_the_input_and_grows_with_flicker():
    torch.manual_seed(0)
    clean = torch.rand(2, 6, 3, 16, 20)
    assert temporal_error(clean, clean).shape == (2, 5)  # one value per clip and frame pair
    assert torch.equal(flicker(clean, clean), torch.zeros(2))
    # an error that stays put costs nothing: a constant offset, or the same noise in every frame
    assert torch.allclose(flicker(clean + 0.1, clean), torch.zeros(2), atol=1e-6)
    static = clean + 0.05 * torch.randn(2, 1, 3, 16, 20)
    assert torch.allclose(flicker(static, clean), torch.zeros(2), atol=1e-6) and (psnr(static, clean) < 30).all()
    # the definition, by hand, for one clip and pair
    noisy = clean + 0.03 * torch.randn_like(clean)
    by_hand = ((noisy[1, 3] - noisy[1, 2]) - (clean[1, 3] - clean[1, 2])).pow(2).mean().sqrt()
    assert temporal_error(noisy, clean)[1, 2].item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert torch.allclose(flicker(noisy, clean), temporal_error(noisy, clean).mean(1))
    # noise new in every frame, of RMSE r, gives about sqrt(2) r; more noise, more flicker
    assert flicker(noisy, clean).mean().item() == pytest.approx(2**0.5 * 0.03, rel=0.03)
    louder = clean + 0.1 * torch.randn_like(clean)
    assert (flicker(louder, clean) > flicker(noisy, clean)).all()
    # flicker in one frame only shows in the two pairs around it
    popped = clean.clone()
    popped[:, 3] += 0.2
    pairs = temporal_error(popped, clean)
    assert torch.allclose(pairs[:, 2:4], torch.full((2, 2), 0.2)) and torch.allclose(pairs[:, [0, 1, 4]], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="T >= 2"):
        temporal_error(clean[:, :1], clean[:, :1])


def test_lpips_files_have_the_published_layout_and_load(tmp_path):
    backbone, heads = save_random_lpips_weights(tmp_path)
    trunk = torch.load(backbone, weights_only=True)
    assert sorted(trunk) == sorted(f"features.{i}.{p}" for i in (0, 3, 6, 8, 10) for p in ("weight", "bias"))
    assert trunk["features.0.weight"].shape == (64, 3, 11, 11)
    head = torch.load(heads, weights_only=True)
    assert {k: tuple(v.shape) for k, v in head.items()} == {
        f"lin{k}.model.1.weight": (1, c, 1, 1) for k, c in enumerate(ALEX_CHANNELS)}
    model = LPIPS.from_files(backbone, heads)
    assert torch.equal(model.net.features[3].weight, trunk["features.3.weight"])
    assert torch.equal(model.heads[4].model[1].weight, head["lin4.model.1.weight"])
    # torchvision's full AlexNet file also holds the classifier: it is ignored
    torch.save({**trunk, "classifier.1.weight": torch.zeros(4096, 9216)}, tmp_path / "full.pth")
    LPIPS.from_files(tmp_path / "full.pth", heads)
    with pytest.raises(ValueError, match="not an LPIPS v0.1 alex head file"):
        LPIPS.from_files(backbone, backbone)


def test_lpips_is_zero_for_equal_inputs_grows_with_distortion_and_only_inputs_get_gradients(tmp_path):
    torch.manual_seed(0)
    model = LPIPS.from_files(*save_random_lpips_weights(tmp_path))
    clean = torch.rand(2, 2, 3, 64, 64)
    assert torch.allclose(model(clean, clean), torch.zeros(2), atol=1e-6)
    small = model(clean + 0.02 * torch.randn_like(clean), clean)
    large = model(clean + 0.3 * torch.randn_like(clean), clean)
    assert (large > small).all() and (small > 0).all()
    prediction = clean.clone().requires_grad_(True)
    model(prediction * 0.9, clean).sum().backward()
    assert prediction.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    model.train()
    assert not model.training  # always in eval mode (no dropout)


def test_missing_lpips_files_name_the_path_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    with pytest.raises(LPIPSUnavailable, match=r"alexnet-owt-7be5be79.pth\) not found at .*hub.* and LPIPS heads .* not found "
                       r"at .*: copy them there"):
        find_lpips_weights()
    backbone, heads = save_random_lpips_weights(tmp_path / "hub" / "hub" / "checkpoints")
    assert find_lpips_weights() == (backbone, heads)  # the torch hub cache is searched by default
    assert isinstance(load_lpips(), LPIPS)


# ------------------------------------------------------------------------------------------------
# Colour, motion and the block-average baseline
# ------------------------------------------------------------------------------------------------


def shifting_video(frames: int = 6, shift: int = 2, size: int = 64) -> torch.Tensor:
    """1,T,3,H,W: a smooth colour texture seen by a camera panning `shift` pixels per frame."""
    generator = torch.Generator().manual_seed(0)
    world = torch.nn.functional.interpolate(torch.rand(1, 3, 16, 24, generator=generator), size=(size + 16, size + 16 + shift * frames),
                                            mode="bicubic", align_corners=False).clamp(0, 1)[0]
    return torch.stack([world[:, 8 : 8 + size, 8 + shift * t : 8 + shift * t + size] for t in range(frames)])[None]


def test_bt601_luma_and_chroma_psnr_separate_a_grey_reconstruction():
    torch.manual_seed(0)
    colour = shifting_video(frames=3)
    y, cb, cr = ycbcr(colour)[0, 0]
    r, g, b = colour[0, 0]
    assert torch.allclose(y, 0.299 * r + 0.587 * g + 0.114 * b, atol=1e-6)
    assert torch.allclose(cr, 0.5 + 0.5 * r - 0.418688 * g - 0.081312 * b, atol=1e-6)
    assert torch.allclose(ycbcr(torch.full((1, 3, 4, 4), 0.7)), torch.tensor([0.7, 0.5, 0.5]).view(1, 3, 1, 1).expand(1, 3, 4, 4), atol=1e-6)
    # a grey reconstruction with the right luma: luma exact, chroma lost, colourfulness gone
    grey = ycbcr(colour)[:, :, :1].expand_as(colour)
    assert luma_psnr(grey, colour).item() > 60 and chroma_psnr(grey, colour).item() < 25
    assert colourfulness_ratio(grey, colour).item() == pytest.approx(0, abs=1e-3)
    assert colourfulness_ratio(colour, colour).item() == pytest.approx(1)
    # luma and chroma PSNR by hand: MSE of Y, and of Cb and Cr together
    noisy = (colour + 0.03 * torch.randn_like(colour)).clamp(0, 1)
    error = ycbcr(noisy) - ycbcr(colour)
    assert luma_psnr(noisy, colour).item() == pytest.approx(-10 * math.log10(error[:, :, 0].pow(2).mean().item()), rel=1e-5)
    assert chroma_psnr(noisy, colour).item() == pytest.approx(-10 * math.log10(error[:, :, 1:].pow(2).mean().item()), rel=1e-5)


def test_colourfulness_follows_hasler_suesstrunk_and_a_grey_source_has_no_ratio():
    image = torch.rand(1, 3, 10, 12, generator=torch.Generator().manual_seed(1))
    r, g, b = (image[0] * 255).double()
    rg, yb = r - g, (r + g) / 2 - b
    expected = math.sqrt(rg.var(unbiased=False) + yb.var(unbiased=False)) + 0.3 * math.sqrt(rg.mean() ** 2 + yb.mean() ** 2)
    assert colourfulness(image).item() == pytest.approx(expected, rel=1e-5)
    assert colourfulness(image[None].expand(1, 4, 3, 10, 12)).item() == pytest.approx(expected, rel=1e-5)  # mean over frames
    assert colourfulness(torch.full((1, 2, 3, 8, 8), 0.4)).item() == 0  # grey
    washed = 0.5 + 0.4 * (image - 0.5)  # contrast towards grey: less colourful
    assert colourfulness_ratio(washed, image).item() == pytest.approx(0.4, rel=1e-4)  # linear in the distance from grey
    assert math.isnan(colourfulness_ratio(image, torch.full_like(image, 0.5)).item())


def test_block_average_keeps_3_numbers_per_64_pixels_and_is_exact_on_flat_blocks():
    flat = torch.full((1, 2, 3, 24, 40), 0.3)
    assert torch.allclose(block_average(flat), flat, atol=1e-6)
    assert block_pool(flat).shape == (1, 2, 3, 3, 5)  # 3 numbers (one per channel) per 8x8 block
    blocks = torch.rand(1, 3, 3, 5).repeat_interleave(8, -2).repeat_interleave(8, -1)  # constant 8x8 tiles
    assert torch.allclose(block_pool(blocks), blocks[..., ::8, ::8])
    smooth = torch.linspace(0, 1, 64).expand(1, 1, 3, 64, 64)  # a ramp: bilinear upsampling of its block means restores it inside
    assert (block_average(smooth) - smooth)[..., 8:-8].abs().max() < 1e-5
    noise = torch.rand(1, 2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    assert psnr(block_average(noise), noise).item() < 15  # detail finer than a block is gone


def test_warping_error_is_near_zero_for_a_perfect_or_steady_reconstruction_and_grows_with_flicker():
    pytest.importorskip("cv2")
    video = shifting_video()
    warps = source_warps(video)
    assert len(warps) == 1 and len(warps[0]) == 5  # one clip, five frame pairs
    assert all(0.8 < mask.mean() < 1 for _, _, mask in warps[0])  # the columns entering the frame are occluded
    perfect = warping_error(video, video, warps=warps)
    assert perfect.item() < 0.005
    assert torch.equal(warping_error(video, video), perfect)  # warps computed inside when not given
    # an error that moves with the content (a blur) or stays put (an offset) is not temporal
    kernel = torch.ones(3, 1, 5, 5) / 25
    blurred = torch.nn.functional.conv2d(torch.nn.functional.pad(video[0], (2, 2, 2, 2), mode="replicate"), kernel, groups=3)[None]
    assert warping_error(blurred, video, warps=warps).item() < 0.015 and flicker(blurred, video).item() > 0.04
    assert warping_error((video + 0.05).clamp(0, 1), video, warps=warps).item() < 0.005
    # noise new in every frame of RMSE r gives about sqrt(2) r; a frozen frame, the content's motion
    flickering = video + 0.03 * torch.randn(video.shape, generator=torch.Generator().manual_seed(3))
    assert warping_error(flickering, video, warps=warps).item() == pytest.approx(2**0.5 * 0.03, rel=0.1)
    frozen = video[:, :1].expand_as(video)
    assert warping_error(frozen, video, warps=warps).item() > 0.05
    with pytest.raises(ValueError, match="T >= 2"):
        warping_error(video[:, :1], video[:, :1])


def test_metrics_import_without_opencv():
    """OpenCV is imported inside the warping functions only: without it the module loads and
    opencv_missing names the package to install."""
    code = ("import sys; sys.modules['cv2'] = None; import models.metrics as m; import models.evaluation as e; "
            "print(m.opencv_missing()); print(e.SourceWarps(__import__('torch').zeros(1, 3, 3, 8, 8)).for_frames(3))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install opencv-python-headless" in result.stdout and result.stdout.strip().endswith("None")
