"""Image-quality metrics shared by training, validation and inference.py.

Every function takes N,T,C,H,W (or N,C,H,W) tensors in [0, 1] and returns one value per clip
(temporal_error: one per frame pair).

- psnr:  10 log10(1 / MSE).
- flicker (temporal_error per frame pair, flicker its mean per clip): the RMSE of frame-to-frame
         changes, sqrt(mean over C,H,W of ((rec[t+1] - rec[t]) - (inp[t+1] - inp[t]))^2), in
         the units of the frames ([0, 1]). 0 when the reconstruction changes exactly as the input
         does (a perfect one, or one off by the same error in every frame); errors that are new
         in every frame (independent, of RMSE r) give sqrt(2) r. Lower is better.
- ssim:  Gaussian-window SSIM (11 taps, sigma 1.5, K1 0.01, K2 0.03, data range 1), averaged over
         channels, pixels and frames; the usual definition (Wang et al. 2004).
- LPIPS: the learned perceptual distance of Zhang et al. 2018 ("alex" net, version 0.1): AlexNet
         features at its five ReLUs, unit-normalised over channels, squared differences weighted
         by learned 1x1 layers, averaged over space and summed. torchvision is not importable
         beside our CPU torch build, so the network is written here with the same parameter
         names, and loads the published files directly:
           backbone: torchvision's `alexnet-owt-7be5be79.pth` (keys `features.N.weight/bias`);
           heads:    the lpips package's `weights/v0.1/alex.pth` (keys `linK.model.1.weight`).
         Both are looked up in the torch hub cache (`<torch.hub.get_dir()>/checkpoints/`) unless
         paths are given; nothing is downloaded. `find_lpips_weights` says what is missing.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

BACKBONE_FILE = "alexnet-owt-7be5be79.pth"
HEADS_FILE = "alex.pth"
ALEX_CHANNELS = (64, 192, 384, 256, 256)


class LPIPSUnavailable(FileNotFoundError):
    """The LPIPS weight files are not on this machine."""


def frames(video: torch.Tensor) -> torch.Tensor:
    """N,T,C,H,W -> N*T,C,H,W (N,C,H,W passes through)."""
    return video.flatten(0, 1) if video.dim() == 5 else video


def psnr(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    mse = (prediction.float() - target.float()).pow(2).flatten(1).mean(1).clamp_min(1e-10)
    return -10 * torch.log10(mse)


def temporal_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """N x (T-1): for each clip and frame pair (t, t+1), the RMSE over C,H,W of the change of
    the reconstruction minus the change of the input. Equal to the RMSE of the change of the
    error e = prediction - target, so an error that stays put costs nothing and one that moves
    (flicker, popping detail, shifting colour) does. Needs N,T,C,H,W with T >= 2."""
    if prediction.dim() != 5 or prediction.shape[1] < 2:
        raise ValueError(f"temporal_error needs N,T,C,H,W with T >= 2 frames, got shape {tuple(prediction.shape)}")
    error = prediction.float() - target.float()
    return (error[:, 1:] - error[:, :-1]).pow(2).flatten(2).mean(2).sqrt()


def flicker(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per clip: temporal_error averaged over its frame pairs."""
    return temporal_error(prediction, target).mean(1)


def _gaussian_window(channels: int, device, size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float32, device=device) - (size - 1) / 2
    g = torch.exp(-coords.pow(2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()


def ssim(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per clip. Frames smaller than the 11-pixel window use a window of their size."""
    n = prediction.shape[0]
    x, y = frames(prediction).float(), frames(target).float()
    channels = x.shape[1]
    size = min(11, x.shape[-2], x.shape[-1])
    window = _gaussian_window(channels, x.device, size)
    c1, c2 = 0.01**2, 0.03**2

    def blur(t):
        return F.conv2d(t, window, groups=channels)

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x.pow(2)
    var_y = blur(y * y) - mu_y.pow(2)
    cov = blur(x * y) - mu_x * mu_y
    score = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x.pow(2) + mu_y.pow(2) + c1) * (var_x + var_y + c2))
    return score.reshape(n, -1).mean(1)


class AlexFeatures(nn.Module):
    """AlexNet's convolutional trunk with torchvision's parameter names (features.0 ... features.10)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=False), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=False), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=False),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=False),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=False),
        )
        self.taps = (1, 4, 7, 9, 11)  # the five ReLU outputs LPIPS compares

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for index, layer in enumerate(self.features):
            x = layer(x)
            if index in self.taps:
                out.append(x)
        return out


class LinearHead(nn.Module):
    """1x1 weighting of one feature level; `model.1` matches the published key layout."""

    def __init__(self, channels: int):
        super().__init__()
        self.model = nn.Sequential(nn.Identity(), nn.Conv2d(channels, 1, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class LPIPS(nn.Module):
    """Frozen perceptual distance; gradients flow to its inputs, never to its weights."""

    # Input normalisation of the published model, applied to images in [-1, 1].
    SHIFT = (-0.030, -0.088, -0.188)
    SCALE = (0.458, 0.448, 0.450)

    def __init__(self):
        super().__init__()
        self.net = AlexFeatures()
        self.heads = nn.ModuleList(LinearHead(c) for c in ALEX_CHANNELS)
        self.register_buffer("shift", torch.tensor(self.SHIFT).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor(self.SCALE).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)
        self.eval()

    @classmethod
    def from_files(cls, backbone_path: str | Path, heads_path: str | Path) -> "LPIPS":
        model = cls()
        backbone = torch.load(backbone_path, map_location="cpu", weights_only=True)
        trunk = {k: v for k, v in backbone.items() if k.startswith("features.")}
        missing = model.net.load_state_dict(trunk, strict=False).missing_keys
        if missing:
            raise ValueError(f"{backbone_path}: not an AlexNet weight file (missing {missing[0]}); "
                             f"use torchvision's {BACKBONE_FILE}")
        heads = torch.load(heads_path, map_location="cpu", weights_only=True)
        try:
            for k, head in enumerate(model.heads):
                head.model[1].weight.copy_(heads[f"lin{k}.model.1.weight"])
        except (KeyError, RuntimeError) as error:
            raise ValueError(f"{heads_path}: not an LPIPS v0.1 alex head file ({error}); "
                             f"use the lpips package's weights/v0.1/{HEADS_FILE}") from None
        return model

    def train(self, mode: bool = True) -> "LPIPS":
        return super().train(False)  # always eval: no dropout, frozen

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per clip (mean over frames); inputs in [0, 1], N,T,C,H,W or N,C,H,W."""
        n = prediction.shape[0]
        dtype = self.shift.dtype
        x = (frames(prediction).to(dtype) * 2 - 1 - self.shift) / self.scale
        y = (frames(target).to(dtype) * 2 - 1 - self.shift) / self.scale
        distance = 0
        for head, fx, fy in zip(self.heads, self.net(x), self.net(y)):
            fx = fx / (fx.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            fy = fy / (fy.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            distance = distance + head((fx - fy).pow(2)).mean((2, 3))
        return distance.reshape(n, -1).mean(1)


def find_lpips_weights(backbone_path: str = "", heads_path: str = "") -> tuple[Path, Path]:
    """The two files, from the given paths or the torch hub cache; LPIPSUnavailable names what is
    missing and where it was looked for."""
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    backbone = Path(backbone_path) if backbone_path else hub / BACKBONE_FILE
    heads = Path(heads_path) if heads_path else hub / HEADS_FILE
    missing = [f"{what} not found at {path}" for path, what in
               ((backbone, f"AlexNet backbone ({BACKBONE_FILE})"), (heads, f"LPIPS heads ({HEADS_FILE})")) if not path.is_file()]
    if missing:
        raise LPIPSUnavailable(f"LPIPS {' and '.join(missing)}: copy {'them' if len(missing) > 1 else 'it'} there, or pass "
                               "the paths (lpips_backbone_path / lpips_weights_path in the config, --lpips-* in inference.py)")
    return backbone, heads


def load_lpips(backbone_path: str = "", heads_path: str = "", device: torch.device | str = "cpu") -> LPIPS:
    return LPIPS.from_files(*find_lpips_weights(backbone_path, heads_path)).to(device)


def save_random_lpips_weights(folder: str | Path, seed: int = 0) -> tuple[Path, Path]:
    """Spec-shaped LPIPS files with random weights (positive heads, as trained ones are), for
    tests and for machines that cannot fetch the real ones. Not a meaningful metric."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    model = LPIPS()
    for param in model.parameters():
        param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    heads = {f"lin{k}.model.1.weight": head.model[1].weight.abs().clone() for k, head in enumerate(model.heads)}
    backbone, heads_file = folder / BACKBONE_FILE, folder / HEADS_FILE
    torch.save(model.net.state_dict(), backbone)
    torch.save(heads, heads_file)
    return backbone, heads_file
