"""What inference.py reports for one reconstruction of a clip, the means over clips, the 8x8
block-average baseline, decode speed, and the notes a reader should not miss (a grey
reconstruction, a model that loses to the baseline). Pure torch on top of models/metrics.py, so
scripts that evaluate models reuse it without the command line."""

from __future__ import annotations

import math
import time

import torch

from models.metrics import (
    block_pool,
    block_upsample,
    chroma_psnr,
    colourfulness,
    luma_psnr,
    opencv_missing,
    psnr,
    source_warps,
    ssim,
    temporal_error,
    warping_error,
)

BASELINE = "block_average_8x8"  # the report's key of the baseline
BASELINE_NAME = "8x8 block average"
BASELINE_BLOCK = 8
GREY_RATIO = 0.5  # a reconstruction keeping less than this share of the source's colourfulness is called grey
# (key, what a reader compares) of the notes against the baseline; higher is better for all three
BEATS_BASELINE_ON = (("psnr", "PSNR"), ("chroma_psnr", "chroma PSNR"), ("colourfulness_ratio", "colourfulness"))
MEAN_METRICS = ("mse", "psnr", "luma_psnr", "chroma_psnr", "ssim", "lpips", "flicker", "warping_error",
                "source_warping_error", "colourfulness", "source_colourfulness")


def finite_or_none(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else value


class SourceWarps:
    """The source's flow and occlusion masks of one clip, computed once per frame count and shared
    by every reconstruction of it; None everywhere when OpenCV is missing."""

    def __init__(self, video: torch.Tensor):
        self.video, self.by_frames = video, {}
        self.unavailable = opencv_missing()

    def for_frames(self, frames: int):
        if self.unavailable or frames < 2:
            return None
        if frames not in self.by_frames:
            self.by_frames[frames] = source_warps(self.video[:, :frames])
        return self.by_frames[frames]


def clip_metrics(decoded: torch.Tensor, target: torch.Tensor, lpips=None, warps: SourceWarps | None = None) -> dict:
    """Every number of one reconstruction of one clip (N = 1): MSE, PSNR, luma and chroma PSNR,
    SSIM, LPIPS (None without its weights), flicker and warping error (None for one frame; warping
    error also without OpenCV) with the source's own warping error (what a perfect one scores), the colourfulness
    of both and their ratio (None for a grey source), per-frame PSNR and per-pair flicker."""
    decoded, target = decoded.float(), target.float()
    pairs = temporal_error(decoded, target)[0].tolist() if decoded.shape[1] >= 2 else []
    flows = warps.for_frames(decoded.shape[1]) if warps is not None else None
    warp = warping_error(decoded, target, warps=flows).item() if flows is not None else None
    own = warping_error(target, target, warps=flows).item() if flows is not None else None
    colour, source_colour = colourfulness(decoded).item(), colourfulness(target).item()
    return {
        "mse": (decoded - target).pow(2).mean().item(),
        "psnr": psnr(decoded, target).item(),
        "luma_psnr": luma_psnr(decoded, target).item(),
        "chroma_psnr": chroma_psnr(decoded, target).item(),
        "ssim": ssim(decoded, target).item(),
        "lpips": lpips(decoded, target).item() if lpips is not None else None,
        "flicker": sum(pairs) / len(pairs) if pairs else None,
        "warping_error": finite_or_none(warp),
        "source_warping_error": finite_or_none(own),
        "colourfulness": colour,
        "source_colourfulness": source_colour,
        "colourfulness_ratio": colour / source_colour if source_colour >= 1.0 else None,
        "per_frame_psnr": [round(psnr(decoded[:, t], target[:, t]).item(), 4) for t in range(decoded.shape[1])],
        "per_pair_flicker": [round(v, 6) for v in pairs],
    }


def mean_of(rows: list[dict]) -> dict:
    """The mean of each metric over clips (None when any clip lacks it), and the colourfulness
    ratio of the means (mean colourfulness / mean source colourfulness: a grey source clip does not
    leave it undefined)."""
    out = {}
    for metric in MEAN_METRICS:
        values = [r[metric] for r in rows if r.get(metric) is not None]
        out[metric] = sum(values) / len(values) if values and len(values) == len(rows) else None
    source = out["source_colourfulness"]
    out["colourfulness_ratio"] = out["colourfulness"] / source if source and source >= 1.0 else None
    return out


def frame_position_means(clips: list[dict]) -> dict:
    """PSNR averaged over every decoded frame of every clip, and by frame position (temporal slot)
    over the positions all clips have: an untrained slot of the decoder shows as one low position.
    Flicker likewise by frame pair (t, t+1), over the pairs all clips have."""
    if not clips:
        return {"frame_mean_psnr": None, "per_position_psnr": [], "per_pair_flicker": []}
    every_frame = [value for clip in clips for value in clip["per_frame_psnr"]]
    positions = min(len(clip["per_frame_psnr"]) for clip in clips)
    by_position = [sum(clip["per_frame_psnr"][t] for clip in clips) / len(clips) for t in range(positions)]
    pairs = min(len(clip["per_pair_flicker"]) for clip in clips)
    by_pair = [sum(clip["per_pair_flicker"][t] for clip in clips) / len(clips) for t in range(pairs)]
    return {"frame_mean_psnr": sum(every_frame) / len(every_frame), "per_position_psnr": [round(v, 4) for v in by_position],
            "per_pair_flicker": [round(v, 6) for v in by_pair]}


class Speed:
    """Frames per second of encode and decode, and peak GPU memory, for one model."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = {"encode": 0.0, "decode": 0.0}
        self.frames = {"encode": 0, "decode": 0}
        self.peak_bytes = 0

    def run(self, what: str, frames: int, function, *args):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        with torch.no_grad():
            result = function(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device))
        self.seconds[what] += time.perf_counter() - start
        self.frames[what] += frames
        return result

    def summary(self) -> dict:
        out = {f"{k}_frames_per_second": round(self.frames[k] / self.seconds[k], 3) if self.seconds[k] else None
               for k in self.seconds}
        # GB of 1e9 bytes, as training/plan/memory.py
        out["peak_gpu_memory_gb"] = round(self.peak_bytes / 1e9, 3) if self.device.type == "cuda" else None
        return out


def block_average_round_trip(video: torch.Tensor, speed: Speed | None = None) -> torch.Tensor:
    """The baseline's reconstruction of N,T,3,H,W (every frame kept), timed as an encode (the pooling)
    and a decode (the upsampling) when `speed` is given."""
    frames = video.shape[1]
    if speed is None:
        return block_upsample(block_pool(video, BASELINE_BLOCK), video.shape[-2:])
    pooled = speed.run("encode", frames, block_pool, video, BASELINE_BLOCK)
    return speed.run("decode", frames, block_upsample, pooled, video.shape[-2:])


def notes(modes: dict[str, dict], baseline: dict | None) -> list[str]:
    """One line per thing a reader must not miss: each mode (name -> its mean) that keeps less than
    GREY_RATIO of the source's colourfulness is named grey; each that loses to the baseline says on
    what."""
    lines = []
    for name, mean in modes.items():
        ratio = mean.get("colourfulness_ratio")
        if ratio is not None and ratio < GREY_RATIO:
            lines.append(f"{name} is GREY: it keeps {ratio:.2f} of the source's colourfulness (below {GREY_RATIO})")
        if baseline is None:
            continue
        lost = [f"{label} {mean[key]:.2f} vs {baseline[key]:.2f}" for key, label in BEATS_BASELINE_ON
                if mean.get(key) is not None and baseline.get(key) is not None and mean[key] < baseline[key]]
        if lost:
            lines.append(f"{name} loses to the {BASELINE_NAME} on " + ", ".join(lost))
    return lines
