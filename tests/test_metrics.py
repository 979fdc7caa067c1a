"""PSNR, SSIM, LPIPS and flicker (models/metrics.py) against independent computations and the
published file layouts."""

import numpy as np
import pytest
import torch

from models.metrics import (
    ALEX_CHANNELS,
    LPIPS,
    LPIPSUnavailable,
    find_lpips_weights,
    flicker,
    load_lpips,
    psnr,
    save_random_lpips_weights,
    ssim,
    temporal_error,
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
