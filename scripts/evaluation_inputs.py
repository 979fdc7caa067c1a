"""What inference.py and its --compare (scripts/compare_models.py) both read and run: a model by
any path --model takes, the clips of --videos or --held-out-of, one clip at the chosen size, the
student's timed round trip, LPIPS when it loads. Below both, so neither imports the other back.
A helper of inference.py, not a command of its own."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from models.evaluation import Speed
from models.metrics import LPIPSUnavailable, load_lpips
from models.taehv import TAEHV
from models.variants import export_in
from training.base.storage import is_remote
from training.data.decode import ClipError, read_clip, resize_and_crop
from training.data.index import probe_video, read_index

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
REFERENCE = "reference"  # the --compare name of the reference VAE's own round trip


def load_student(model: Path, variant: str | None) -> tuple[TAEHV, Path]:
    """The model and the file its weights came from, for every kind of --model path."""
    if model.is_file():
        return TAEHV.from_pretrained(model, variant=variant), model
    if not model.is_dir():
        raise FileNotFoundError(f"--model {model}: no such file or folder")
    for folder in (model / "final", model / "best_model", model):
        found = export_in(folder)  # <variant>.safetensors / .pth, or an older export's taehv.*
        if found is not None:
            return TAEHV.from_pretrained(found, variant=variant), found
    from training.run.checkpoint_files import is_checkpoint_folder

    if is_checkpoint_folder(model):  # a training checkpoint: its EMA weights
        from scripts.convert_checkpoint import checkpoint_model

        return checkpoint_model(model, "ema", variant), model
    raise FileNotFoundError(f"--model {model}: no TAEHV weight file (<variant>.safetensors or .pth) in it, its final/ or best_model/, "
                            "and it is not a checkpoint folder")


def load_model(model: Path, variant: str | None) -> tuple[TAEHV, Path]:
    """load_student, with its warnings (e.g. weights whose variant cannot be told) as one line each."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load_student(model, variant)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    return loaded


def clip_paths(sources: list[str]) -> list[Path]:
    paths: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir() or path.suffix in (".jsonl", ".csv", ".json"):
            index = read_index(path)
            paths += [index.path(i) for i in range(len(index))]
        else:
            paths.append(path)
    return paths


def held_out_clips(run: Path) -> list[Path]:
    """The clips a training run held out (its resolved_config.json: data_root, index_path,
    validation_fraction and validation_sources, split by the same rule as training/data/index.py)."""
    path = run / "resolved_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"--held-out-of {run}: no resolved_config.json in it; give a run folder (output/latest)")
    config = json.loads(path.read_text())
    data_root = config["data_root"]
    source = config.get("index_path") or data_root
    if not is_remote(source) and not Path(source).exists():
        raise FileNotFoundError(f"--held-out-of {run}: its data ({source}) is not here; run from the folder it trained "
                                "in, or pass --videos")
    if config.get("latent_cache"):
        raise ValueError(f"--held-out-of {run}: the run read a latent cache; pass its held-out clips with --videos")
    _, validation = read_index(source, data_root).split(config["validation_fraction"], config.get("validation_sources", ""))
    return [validation.lasting_path(i) for i in range(len(validation))]  # from object storage: cached copies


def native_size(path: Path, multiple: int) -> tuple[int, int]:
    """The clip's displayed size (rotation applied), rounded down to `multiple`."""
    info = probe_video(path)
    height, width = info["height"], info["width"]
    if abs(info["rotation"]) % 180 == 90:
        height, width = width, height
    if height < multiple or width < multiple:
        raise ClipError("too_small", f"{width}x{height} is below {multiple} pixels")
    return height // multiple * multiple, width // multiple * multiple


def read_video(path: Path, args, multiple: int, device: torch.device) -> tuple[int, int, torch.Tensor]:
    """One clip as 1,T,3,H,W in [0, 1] on `device`, at --height/--width or its native size rounded
    down to `multiple`; ClipError when it cannot be read."""
    height, width = native_size(path, multiple) if args.native else (args.height, args.width)
    frames, _, _ = read_clip(path, -1, args.frames, args.stride, args.stride, random.Random(0), loop_short=False,
                             cover=(height, width))
    video = resize_and_crop(torch.from_numpy(frames).permute(0, 3, 1, 2), height, width, rng=None)[0]
    return height, width, video[None].to(device).float() / 255


def code_version() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parents[1],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def student_round_trip(student: TAEHV, video: torch.Tensor, speed: Speed, dtype, streaming: bool) -> torch.Tensor:
    """The student's encode and decode of N,T,3,H,W, each timed; decoded frames in fp32."""
    n_frames, parallel, x = video.shape[1], not streaming, video.to(dtype)
    latents = speed.run("encode", n_frames, lambda: student.encode_video(x, parallel=parallel))
    return speed.run("decode", n_frames, lambda: student.decode_video(latents, parallel=parallel)).float()


def lpips_or_reason(args, device: torch.device):
    """(LPIPS, None), or (None, why it is unavailable)."""
    try:
        return load_lpips(args.lpips_backbone, args.lpips_heads, device), None
    except LPIPSUnavailable as error:
        return None, str(error)


def progress_over(paths: list[Path]):
    if not sys.stderr.isatty():
        return paths
    from tqdm import tqdm

    return tqdm(paths, unit="clip")
