"""Decoding with PyAV: seek to the keyframe before the window, decode forward, scale while converting
to RGB, rotate, crop, maybe flip."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


class ClipError(Exception):
    """A file that cannot give the requested clip; `reason` is one of SKIP_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def choose_window(frame_count: int, n_frames: int, min_delta: int, max_delta: int, rng: random.Random) -> tuple[int, int]:
    """(start, stride) of a clip inside `frame_count` frames; strides the clip cannot fit are not drawn."""
    if frame_count < 1 or (n_frames - 1) * min_delta + 1 > frame_count:
        raise ClipError("too_short", f"{frame_count} frames, need {(n_frames - 1) * min_delta + 1}")
    longest = min(max_delta, (frame_count - 1) // max(n_frames - 1, 1)) if n_frames > 1 else max_delta
    stride = rng.randint(min_delta, max(min_delta, longest))
    span = (n_frames - 1) * stride + 1
    return rng.randrange(frame_count - span + 1), stride


def cover_size(height: int, width: int, target_height: int, target_width: int) -> tuple[int, int]:
    """Smallest size with the same aspect ratio that covers the target (up- or downscaling)."""
    scale = max(target_height / height, target_width / width)
    return max(target_height, round(height * scale)), max(target_width, round(width * scale))


@dataclass
class Decoded:
    frames: list[np.ndarray]  # h,w,3 uint8 as stored (scaled when asked)
    rotation: int  # degrees, from the display matrix
    seen: int  # frames the stream has up to the last one decoded
    decoded: int  # frames the decoder produced (from the keyframe before the start)


def decode_frames(path: Path, wanted: list[int], cover: tuple[int, int] | None = None, threads: int = 2) -> Decoded:
    """Frames at the given (sorted) indices, by seeking to the keyframe before the first one and
    decoding forward. Frame indices are times x average fps, so variable-rate files and wrong
    header counts work. With `cover` (H, W), frames are scaled during the RGB conversion
    (libswscale) so that, once rotated, they cover H x W; without it they keep their stored size."""
    import av

    try:
        container = av.open(str(path))
    except Exception as error:
        raise ClipError("open_error", f"{path}: {error}") from None
    frames: list[np.ndarray] = []
    rotation, seen, decoded = 0, 0, 0
    with container:
        if not container.streams.video:
            raise ClipError("no_video_stream", str(path))
        stream = container.streams.video[0]
        # frame and slice threads, a fixed few: PyAV's default (one per core) times workers times
        # ranks oversubscribes a node
        stream.thread_type = "AUTO"
        stream.thread_count = threads
        fps = float(stream.average_rate or stream.guessed_rate or 25)
        time_base = float(stream.time_base)
        start_pts = stream.start_time or 0
        if wanted[0] > 0:
            container.seek(start_pts + int(wanted[0] / fps / time_base), stream=stream, backward=True, any_frame=False)
        targets = iter(wanted)
        target = next(targets)
        scaling: dict = {"format": "rgb24"}
        try:
            for frame in container.decode(stream):
                decoded += 1
                index = round((frame.pts - start_pts) * time_base * fps) if frame.pts is not None else seen
                seen = max(seen, index + 1)
                while target is not None and index >= target:  # a gap takes the next frame
                    if not frames:  # the first kept frame fixes rotation and scaling for the clip
                        rotation = int(getattr(frame, "rotation", 0) or 0)
                        if cover:
                            scaling.update(_scaling(frame.height, frame.width, rotation, cover))
                    frames.append(frame.to_ndarray(**scaling))
                    target = next(targets, None)
                if target is None:
                    break
        except Exception as error:
            raise ClipError("decode_error", f"{path}: {error}") from None
    return Decoded(frames, rotation, seen, decoded)


def header_frame_count(path: Path) -> int:
    """Frame count from the container header, else duration x fps (an estimate that read_clip
    corrects when decoding finds fewer frames); 1,000,000 when neither is known."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if stream.frames:
                return stream.frames
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            seconds = float(stream.duration * stream.time_base) if stream.duration else (container.duration or 0) / 1e6
            return round(seconds * fps) if seconds and fps else 1_000_000
    except Exception as error:
        raise ClipError("open_error", f"{path}: {error}") from None


def zoomed_cover(height: int, width: int, rotation: int, cover: tuple[int, int], u: float, min_side: int) -> tuple[int, int]:
    """The size to scale a stored frame to so that an H x W crop of it shows a region whose shorter
    side is min_side + u * (largest - min_side) pixels of the original (largest: the biggest
    region of the training aspect in the frame; no zoom when that is already below min_side)."""
    quarter_turn = round(rotation / 90) % 2 == 1
    shown_h, shown_w = (width, height) if quarter_turn else (height, width)
    target_h, target_w = cover
    largest = min(target_h, target_w) / max(target_h / shown_h, target_w / shown_w)
    side = largest if largest <= min_side else min_side + u * (largest - min_side)
    zoom = largest / side
    return math.ceil(target_h * zoom), math.ceil(target_w * zoom)


def _scaling(height: int, width: int, rotation: int, cover: tuple[int, int]) -> dict:
    """swscale arguments for a stored frame whose rotated view must cover `cover` (H, W)."""
    quarter_turn = round(rotation / 90) % 2 == 1
    shown = (width, height) if quarter_turn else (height, width)
    new_h, new_w = cover_size(*shown, *cover)
    stored_h, stored_w = (new_w, new_h) if quarter_turn else (new_h, new_w)
    if (stored_h, stored_w) == (height, width):
        return {}
    shrinking = stored_h * stored_w < height * width
    return {"height": stored_h, "width": stored_w, "interpolation": "AREA" if shrinking else "BILINEAR"}


def read_clip(path: Path, frame_count: int, n_frames: int, min_delta: int, max_delta: int,
              rng: random.Random, loop_short: bool, cover: tuple[int, int] | None = None,
              threads: int = 2) -> tuple[np.ndarray, int, list[int]]:
    """(n_frames,H,W,3 uint8 with rotation applied and scaled to cover `cover` when given, frames
    the decoder produced, the stream frame index behind each output frame). A wrong or missing
    header count is corrected by what decoding finds, with one more seek."""
    decoded_total = 0
    if frame_count < 1:
        frame_count = header_frame_count(path)
    for attempt in range(2):
        try:
            start, stride = choose_window(frame_count, n_frames, min_delta, max_delta, rng)
        except ClipError:
            if not loop_short or frame_count < 1:
                raise
            start, stride = 0, 1
        wanted = [start + i * stride for i in range(n_frames)]
        if loop_short and frame_count < wanted[-1] + 1:
            wanted = sorted({w % frame_count for w in wanted})
        result = decode_frames(path, wanted, cover, threads)
        decoded_total += result.decoded
        frames, rotation = result.frames, result.rotation
        if len(frames) == len(wanted):
            break
        if result.seen == 0:
            raise ClipError("no_frames", str(path))
        frame_count = result.seen  # the header promised more than the stream holds
    else:
        raise ClipError("decode_error", f"{path}: stream ended after {result.seen} frames")
    sources = [wanted[i % len(wanted)] for i in range(n_frames)]  # loops a short clip
    frames = [frames[i % len(frames)] for i in range(n_frames)]
    return _rotated(np.stack(frames), rotation), decoded_total, sources


def _rotated(video: np.ndarray, rotation: int) -> np.ndarray:
    if rotation:
        video = np.rot90(video, k=round(rotation / 90) % 4, axes=(1, 2))
    return np.ascontiguousarray(video)


def read_frames(path: Path, sources: list[int], cover: tuple[int, int] | None = None) -> tuple[np.ndarray, int]:
    """The frames read_clip returned for these `sources` (a recipe stored in a latent cache), with
    rotation and cover scaling applied the same way."""
    wanted = sorted(set(sources))
    result = decode_frames(path, wanted, cover)
    if len(result.frames) != len(wanted):
        raise ClipError("decode_error", f"{path}: stream ended after {result.seen} frames, the cached clip needs frame {wanted[-1]}")
    by_index = dict(zip(wanted, result.frames))
    return _rotated(np.stack([by_index[s] for s in sources]), result.rotation), result.decoded


def resize_and_crop(video: torch.Tensor, height: int, width: int, rng: random.Random | None,
                    origin: tuple[int, int] | None = None) -> tuple[torch.Tensor, tuple[int, int]]:
    """T,3,h,w uint8 -> (T,3,height,width uint8, (top, left)): scale (keeping aspect, up or down)
    to cover, then crop at `origin` when given, else random when rng is given, else centred."""
    h, w = video.shape[-2:]
    new_h, new_w = cover_size(h, w, height, width)
    if (new_h, new_w) != (h, w):  # frames from read_clip(cover=...) already cover: crop only
        video = F.interpolate(video.float(), size=(new_h, new_w), mode="bilinear", antialias=True, align_corners=False)
        video = video.round().clamp(0, 255).to(torch.uint8)
    if origin is None:
        origin = ((rng.randrange(new_h - height + 1), rng.randrange(new_w - width + 1)) if rng
                  else ((new_h - height) // 2, (new_w - width) // 2))
    top, left = origin
    return video[..., top : top + height, left : left + width], (top, left)


def zoomed_crop(video: torch.Tensor, height: int, width: int, u: float, min_side: int,
                rng: random.Random) -> tuple[torch.Tensor, tuple[int, int]]:
    """Scale augmentation: T,3,h,w uint8 frames at their own size (rotation applied) -> the
    height x width crop, at a random (top, left), of the frame scaled to cover zoomed_cover(...).
    Zooming in, only the crop is computed (bilinear sampling of the original at the positions the
    whole scaled frame would use: the same pixels, without scaling a 1080p frame up to 17x);
    zooming out, the frame is scaled down first, as no larger than the original."""
    h, w = video.shape[-2:]
    zoomed_h, zoomed_w = cover_size(h, w, *zoomed_cover(h, w, 0, (height, width), u, min_side))  # keeping the aspect
    top, left = rng.randrange(zoomed_h - height + 1), rng.randrange(zoomed_w - width + 1)
    if zoomed_h * zoomed_w <= h * w:
        scaled = F.interpolate(video.float(), size=(zoomed_h, zoomed_w), mode="bilinear", antialias=True, align_corners=False)
        crop = scaled[..., top : top + height, left : left + width]
    else:  # source positions as torch's bilinear (align_corners=False) maps them, clamped at the border
        ys = ((torch.arange(top, top + height) + 0.5) * (h / zoomed_h) - 0.5).clamp(0, h - 1)
        xs = ((torch.arange(left, left + width) + 0.5) * (w / zoomed_w) - 0.5).clamp(0, w - 1)
        grid = torch.stack(torch.meshgrid(xs / max(w - 1, 1) * 2 - 1, ys / max(h - 1, 1) * 2 - 1, indexing="xy"), dim=-1)
        crop = F.grid_sample(video.float(), grid.expand(video.shape[0], height, width, 2), mode="bilinear",
                             padding_mode="border", align_corners=True)
    return crop.round().clamp(0, 255).to(torch.uint8), (top, left)
