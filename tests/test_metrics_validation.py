"""Training validation logs the colour and motion metrics of models/metrics.py: luma and chroma
PSNR, the colourfulness ratio and the warping error, computed as inference.py computes them, and
without OpenCV it says so once and logs the others."""

import re
import sys
from types import SimpleNamespace

import pytest
import torch

from models.metrics import chroma_psnr, colourfulness, luma_psnr, warping_error, ycbcr
from models.taehv import TAEHV
from training.config.load import load_config
from training.loop import validation
from training.loop.validation import validate, validation_line


def panning_clip(seed: int, frames: int = 8, size: int = 32) -> dict:
    """A held-out clip as the dataset gives it: uint8 T,3,H,W, a smooth colour texture panning 1 pixel a frame."""
    world = torch.nn.functional.interpolate(torch.rand(1, 3, 8, 12, generator=torch.Generator().manual_seed(seed)),
                                            size=(size, size + frames), mode="bicubic", align_corners=False).clamp(0, 1)[0]
    video = torch.stack([world[:, :, t : t + size] for t in range(frames)])
    return {"video": (video * 255).round().to(torch.uint8)}


class Log:
    def __init__(self):
        self.lines = []

    def line(self, text):
        self.lines.append(text)


def run_of(clips):
    config = load_config("test", ["validation_samples=3", "validation_batch_size=2"], 1, check_paths=False)  # 8 frames in, 5 back
    return SimpleNamespace(config=config, validation_dataset=clips, lpips=None, log=Log(), accelerator=SimpleNamespace(
        process_index=0, num_processes=1, device=torch.device("cpu"), is_main_process=False))


class Grey(torch.nn.Module):
    """The round trip's 5 frames with the right luma and no colour."""

    def forward(self, video):
        return ycbcr(video[:, :5])[:, :, :1].expand(-1, -1, 3, -1, -1)


def test_validation_logs_luma_chroma_colourfulness_and_warping_error_as_inference_computes_them():
    pytest.importorskip("cv2")
    clips = [panning_clip(seed) for seed in range(3)]
    run = run_of(clips)
    torch.manual_seed(0)
    model = TAEHV("taehv").eval()
    metrics = validate(run, model)
    videos = torch.stack([clip["video"] for clip in clips]).float() / 255
    with torch.no_grad():
        decoded = model(videos)
    target = videos[:, : decoded.shape[1]]  # decoded frame j against input frame j (training/step/losses.py aligned)
    assert metrics["luma_psnr"] == pytest.approx(luma_psnr(decoded, target).mean().item(), rel=1e-4)
    assert metrics["chroma_psnr"] == pytest.approx(chroma_psnr(decoded, target).mean().item(), rel=1e-4)
    assert metrics["colourfulness_ratio"] == pytest.approx((colourfulness(decoded).sum() / colourfulness(target).sum()).item(), rel=1e-4)
    assert metrics["warping_error"] == pytest.approx(warping_error(decoded, target).mean().item(), rel=1e-4)
    line = validation_line(4, metrics, 1.0)
    assert re.search(r"\| by frame: ([\d.]+ ){5}dB \| warping_error: [\d.]+ \| colourfulness_ratio: [\d.]+ \| "
                     r"luma_psnr: [\d.]+ dB \| chroma_psnr: [\d.]+ dB \| 1.0 s$", line), line
    grey = validate(run, Grey())
    assert grey["colourfulness_ratio"] < 0.01 and grey["luma_psnr"] > 40 and grey["chroma_psnr"] < grey["luma_psnr"] - 10
    assert grey["warping_error"] < metrics["warping_error"]  # a steady (if grey) reconstruction moves as the source


def test_without_opencv_validation_says_so_once_and_logs_the_rest(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # `import cv2` raises ImportError
    monkeypatch.setattr(validation, "_reported_missing_opencv", False)
    run = run_of([panning_clip(0)])
    first, second = validate(run, Grey()), validate(run, Grey())
    assert "warping_error" not in first and "warping_error" not in second
    assert {"luma_psnr", "chroma_psnr", "colourfulness_ratio", "psnr", "flicker"} <= set(first)
    assert len(run.log.lines) == 1 and "warping_error is not measured" in run.log.lines[0]
    assert "pip install opencv-python-headless" in run.log.lines[0]


class PanningClips(list):
    """Held-out clips that, like VideoClipDataset, can be cut again at another size."""

    def at_size(self, height, width):
        assert height == width
        return PanningClips(panning_clip(seed, size=height) for seed in range(len(self)))


def test_validation_also_scores_the_extra_sizes_beside_the_block_average():
    from models.metrics import block_average, psnr

    run = run_of(PanningClips(panning_clip(seed) for seed in range(3)))
    run.config = load_config("test", ["validation_samples=3", "validation_sizes=64x64"], 1, check_paths=False)
    assert run.config.validation_sizes == ((64, 64),)
    torch.manual_seed(0)
    model = TAEHV("taehv").eval()
    metrics = validate(run, model)
    videos = torch.stack([clip["video"] for clip in run.validation_dataset.at_size(64, 64)]).float() / 255
    with torch.no_grad():
        decoded = model(videos)
    target = videos[:, : decoded.shape[1]]
    blur = block_average(target)
    assert metrics["64x64_psnr"] == pytest.approx(psnr(decoded, target).mean().item(), rel=1e-4)
    assert metrics["64x64_chroma_psnr"] == pytest.approx(chroma_psnr(decoded, target).mean().item(), rel=1e-4)
    assert metrics["64x64_colourfulness_ratio"] == pytest.approx((colourfulness(decoded).sum() / colourfulness(target).sum()).item(), rel=1e-4)
    assert metrics["64x64_block_average_psnr"] == pytest.approx(psnr(blur, target).mean().item(), rel=1e-4)
    assert metrics["64x64_block_average_chroma_psnr"] == pytest.approx(chroma_psnr(blur, target).mean().item(), rel=1e-4)
    assert metrics["64x64_block_average_colourfulness_ratio"] == pytest.approx(
        (colourfulness(blur).sum() / colourfulness(target).sum()).item(), rel=1e-4)
    assert metrics["psnr"] != metrics["64x64_psnr"]  # the training size is still scored at its own size
    assert re.search(r"64x64_psnr: [\d.]+ dB \| 64x64_chroma_psnr: [\d.]+ dB", validation_line(4, metrics)), validation_line(4, metrics)


@pytest.mark.parametrize("value, message", [
    ("60x64", "validation_sizes: 60x64 must have both sides positive multiples of 8 for taehv: use 64x64"),
    ("64x64,64x64", "validation_sizes lists 64x64 more than once: remove the repeat"),
    ("64", "validation_sizes=64: --set lists height,width pairs"),
])
def test_bad_validation_sizes_get_one_line_naming_the_key_and_the_fix(value, message):
    from training.config.schema import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("test", [f"validation_sizes={value}", "height=32", "width=32"], 1, check_paths=False)
