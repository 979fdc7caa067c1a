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
- luma_psnr, chroma_psnr: PSNR of BT.601 full-range (JPEG) YCbCr, of Y alone and of Cb and Cr
         together (each in [0, 1], peak 1): a grey reconstruction keeps a decent luma PSNR and
         loses chroma PSNR.
- colourfulness: Hasler and Suesstrunk 2003, per frame sqrt(std(rg)^2 + std(yb)^2) + 0.3
         sqrt(mean(rg)^2 + mean(yb)^2) with rg = R - G, yb = (R + G) / 2 - B, on the paper's 0..255
         scale (about 0 grey, 33 moderately, 59 quite, 109 extremely colourful), averaged over
         frames; colourfulness_ratio is the reconstruction's over the source's (1 keeps the colour,
         0 is grey; undefined, NaN, for a source below MIN_SOURCE_COLOURFULNESS).
- warping_error: temporal consistency along the source's motion. Farneback optical flow between
         consecutive SOURCE frames (OpenCV, imported only here) warps the reconstruction's frame
         t-1 onto frame t; the RMSE over channels and the pixels where the source's own warp agrees
         (occlusion mask: in the frame and mean |warped source t-1 - source t| < threshold) per
         frame pair, averaged over pairs. Same units as flicker; lower is better. A perfect
         reconstruction scores the source's own value (warping_error(target, target): flow error,
         noise); below it means smoothed away detail (a blur), not better.
- block_average: the "8x8 block average" baseline, each frame average-pooled by 8 and bilinearly
         upsampled back (3 numbers per 64 pixels per frame, fewer than the 4 a TAE latent keeps).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
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


def aligned(video: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    """The first frames of `video`, as many as `decoded` has: what a decode is compared with."""
    return video[:, : decoded.shape[1]]


def psnr(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    mse = (prediction.float() - target.float()).pow(2).flatten(1).mean(1).clamp_min(1e-10)
    return -10 * torch.log10(mse)


# BT.601 luma and chroma weights (JPEG full range: Cb and Cr centred on 0.5)
YCBCR_601 = ((0.299, 0.587, 0.114), (-0.168736, -0.331264, 0.5), (0.5, -0.418688, -0.081312))
MIN_SOURCE_COLOURFULNESS = 1.0  # on the 0..255 scale: a source below this is grey, its ratio undefined
WARP_THRESHOLD = 0.05  # occlusion mask: the warped source may differ from the source by less than this


def _psnr_of_mse(mse: torch.Tensor) -> torch.Tensor:
    return -10 * torch.log10(mse.clamp_min(1e-10))


def _rotate(video: torch.Tensor, rows: slice) -> torch.Tensor:
    """The rows of the YCbCr matrix applied along the channel axis (-3), without offsets."""
    matrix = torch.tensor(YCBCR_601, dtype=torch.float32, device=video.device)[rows]
    x = video.float()
    return torch.stack([sum(w * x[..., j, :, :] for j, w in enumerate(row)) for row in matrix], dim=-3)


def ycbcr(video: torch.Tensor) -> torch.Tensor:
    """RGB -> BT.601 full-range YCbCr along the channel axis (-3), all in [0, 1] for RGB in [0, 1]."""
    return _rotate(video, slice(0, 3)) + torch.tensor((0.0, 0.5, 0.5), device=video.device).view(3, 1, 1)


def luma_psnr(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per clip: PSNR of the BT.601 luma Y (linear: the error's luma is the luma error)."""
    error = _rotate(prediction.float() - target.float(), slice(0, 1))
    return _psnr_of_mse(error.pow(2).flatten(1).mean(1))


def chroma_psnr(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per clip: PSNR over the BT.601 chroma Cb and Cr together."""
    error = _rotate(prediction.float() - target.float(), slice(1, 3))
    return _psnr_of_mse(error.pow(2).flatten(1).mean(1))


def colourfulness(video: torch.Tensor) -> torch.Tensor:
    """Per clip (N,T,3,H,W; N,3,H,W is N one-frame clips): Hasler-Suesstrunk colourfulness on the
    0..255 scale, averaged over frames."""
    x = video.float().reshape(video.shape[0], -1, *video.shape[-3:]) * 255
    rg = (x[:, :, 0] - x[:, :, 1]).flatten(2)
    yb = (0.5 * (x[:, :, 0] + x[:, :, 1]) - x[:, :, 2]).flatten(2)
    spread = (rg.var(2, unbiased=False) + yb.var(2, unbiased=False)).sqrt()
    centre = (rg.mean(2).pow(2) + yb.mean(2).pow(2)).sqrt()
    return (spread + 0.3 * centre).mean(1)


def colourfulness_ratio(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per clip: colourfulness(prediction) / colourfulness(target); NaN where the target is grey
    (below MIN_SOURCE_COLOURFULNESS). Below about 0.5 the reconstruction looks washed out."""
    source = colourfulness(target)
    ratio = colourfulness(prediction) / source.clamp_min(MIN_SOURCE_COLOURFULNESS)
    return torch.where(source >= MIN_SOURCE_COLOURFULNESS, ratio, torch.full_like(ratio, float("nan")))


def block_pool(video: torch.Tensor, block: int = 8) -> torch.Tensor:
    """Each frame's mean over block x block tiles (a partial tile at an edge that is not a multiple
    of `block` is averaged over its own pixels): ...,C,ceil(H/block),ceil(W/block)."""
    x = video.float().reshape(-1, *video.shape[-3:])
    size = (math.ceil(video.shape[-2] / block), math.ceil(video.shape[-1] / block))
    return F.adaptive_avg_pool2d(x, size).reshape(*video.shape[:-2], *size)


def block_upsample(pooled: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    x = pooled.reshape(-1, *pooled.shape[-3:])
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False).reshape(*pooled.shape[:-2], *size)


def block_average(video: torch.Tensor, block: int = 8) -> torch.Tensor:
    """The block-average baseline: average-pool each frame by `block`, bilinear back to its size."""
    return block_upsample(block_pool(video, block), video.shape[-2:])


def opencv_missing() -> str | None:
    """None when OpenCV (for warping_error) imports, else the one-line reason and fix."""
    try:
        import cv2  # noqa: F401
    except ImportError as error:
        return f"OpenCV is not installed ({error}): pip install opencv-python-headless"
    return None


def source_warps(target: torch.Tensor, threshold: float = WARP_THRESHOLD) -> list[list[tuple]]:
    """Per clip of N,T,3,H,W in [0, 1], per frame pair (t-1, t): (map_x, map_y, mask), the
    coordinates in frame t-1 that Farneback flow of the source (luma, frame t to t-1) gives each
    pixel of frame t, and where the source's own warp agrees (in the frame, mean over channels of
    |warped source t-1 - source t| < threshold). Computed once per clip and shared by every
    reconstruction of it."""
    import cv2

    source = target.detach().float().cpu().permute(0, 1, 3, 4, 2).numpy()  # N,T,H,W,C
    height, width = source.shape[2:4]
    luma = np.clip(np.round((source @ np.asarray(YCBCR_601[0], np.float32)) * 255), 0, 255).astype(np.uint8)
    levels = max(1, min(5, int(math.log2(max(1, min(height, width) // 8))) + 1))  # top level about 8 pixels or more
    grid_y, grid_x = np.mgrid[0:height, 0:width].astype(np.float32)
    warps = []
    for clip, clip_luma in zip(source, luma):
        pairs = []
        for t in range(1, len(clip)):
            flow = cv2.calcOpticalFlowFarneback(clip_luma[t], clip_luma[t - 1], None, 0.5, levels, 15, 3, 5, 1.2, 0)
            map_x, map_y = grid_x + flow[..., 0], grid_y + flow[..., 1]
            inside = (map_x >= 0) & (map_x <= width - 1) & (map_y >= 0) & (map_y <= height - 1)
            warped = cv2.remap(clip[t - 1], map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
            agrees = np.abs(warped.reshape(height, width, -1) - clip[t]).mean(-1) < threshold
            pairs.append((map_x, map_y, inside & agrees))
        warps.append(pairs)
    return warps


def warping_error(prediction: torch.Tensor, target: torch.Tensor, threshold: float = WARP_THRESHOLD,
                  warps: list[list[tuple]] | None = None) -> torch.Tensor:
    """Per clip: the RMSE between the prediction's frame t and its frame t-1 warped by the source's
    flow, over the pixels of the occlusion mask, averaged over frame pairs (pairs with an empty
    mask are left out; NaN when every pair is). `warps`: source_warps(target, threshold), when
    already computed. Needs N,T,C,H,W with T >= 2 and OpenCV."""
    if prediction.dim() != 5 or prediction.shape[1] < 2:
        raise ValueError(f"warping_error needs N,T,C,H,W with T >= 2 frames, got shape {tuple(prediction.shape)}")
    import cv2

    warps = source_warps(target[:, : prediction.shape[1]], threshold) if warps is None else warps
    video = prediction.detach().float().cpu().permute(0, 1, 3, 4, 2).numpy()
    out = []
    for clip, pairs in zip(video, warps):
        errors = []
        for t, (map_x, map_y, mask) in enumerate(pairs, start=1):
            if mask.any():
                warped = cv2.remap(clip[t - 1], map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
                squared = ((warped.reshape(clip[t].shape) - clip[t]) ** 2).mean(-1)
                errors.append(float(np.sqrt(squared[mask].mean())))
        out.append(sum(errors) / len(errors) if errors else float("nan"))
    return torch.tensor(out, dtype=torch.float32)


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


@contextmanager
def convolutions_in_fp32():
    """cuDNN runs fp32 convolutions in TF32 (a 10-bit mantissa) wherever torch allows it, and
    training allows it (training/loop/build.py): a metric's convolutions run in full fp32 here, so
    its value does not depend on the device. torch >= 2.9 has one flag per operation, older torch one."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    owner, name, full = (conv, "fp32_precision", "ieee") if conv is not None else (torch.backends.cudnn, "allow_tf32", False)
    before = getattr(owner, name)
    setattr(owner, name, full)
    try:
        yield
    finally:
        setattr(owner, name, before)


def ssim(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per clip. Frames smaller than the 11-pixel window use a window of their size. The local
    variances are E[x^2] - E[x]^2, a difference of nearly equal numbers: they are taken of the
    frames less their mean (per frame and channel; exact, the window sums to 1), so a rounding of
    the blur's inputs (TF32 where the full-fp32 request is not honoured) moves SSIM by about 1e-4,
    not 1e-3."""
    n = prediction.shape[0]
    x, y = frames(prediction).float(), frames(target).float()
    channels = x.shape[1]
    size = min(11, x.shape[-2], x.shape[-1])
    window = _gaussian_window(channels, x.device, size)
    c1, c2 = 0.01**2, 0.03**2

    def blur(t):
        return F.conv2d(t, window, groups=channels)

    x_offset, y_offset = x.mean((-2, -1), keepdim=True), y.mean((-2, -1), keepdim=True)
    dx, dy = x - x_offset, y - y_offset
    with convolutions_in_fp32():
        mu_dx, mu_dy = blur(dx), blur(dy)
        var_x = blur(dx * dx) - mu_dx.pow(2)
        var_y = blur(dy * dy) - mu_dy.pow(2)
        cov = blur(dx * dy) - mu_dx * mu_dy
    mu_x, mu_y = mu_dx + x_offset, mu_dy + y_offset
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
