"""Evaluate a TAEHV model on real videos, optionally against the reference VAE it was distilled from.

    python inference.py --model output/latest --videos /data/eval_clips --num-samples 20 \
        --frames 17 --height 480 --width 720 --out eval/
    python inference.py --model checkpoints/taecvx.pth --videos clips/ --native --frames 17 \
        --ref-vae cogvideox --ref-vae-path /models/CogVideoX-2b --out eval_vs_ref/

--model: a run folder (final/, else best_model/), an export folder (final/, best_model/), a
checkpoint folder (checkpoints/checkpoint-N: its EMA weights), or a public-format .pth /
.safetensors file (--variant when neither the file nor a model_info.json beside it can tell).
--videos: files, folders, or an index (JSONL/CSV/annotation JSON) in the data pipeline's formats.
--held-out-of RUN: instead of --videos, the clips training run RUN held out from its data (the
    demo evaluates itself with `--held-out-of output/latest`).
--native: each clip at its own size, rounded down to a multiple of 8 x the variant's patch size.

Writes to --out: report.json (layout in docs/evaluation.md), report.md, per clip a side-by-side
mp4 (input | reconstruction | error x4) and per-frame PSNR plot, and contact_sheet.png.
Unreadable clips are skipped with their reason; the exit code is non-zero only if nothing could
be evaluated (2 for a bad argument, 1 for no clip evaluated).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from models.metrics import LPIPSUnavailable, load_lpips, psnr, ssim, temporal_error
from models.reference_families import FAMILIES
from models.taehv import TAEHV
from training.base.storage import is_remote
from training.data.decode import ClipError, read_clip, resize_and_crop
from training.data.index import probe_video, read_index

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ERROR_GAIN = 4  # the error panel shows |reconstruction - input| x 4


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------


def load_student(model: Path, variant: str | None) -> tuple[TAEHV, Path]:
    """The model and the file its weights came from, for every kind of --model path."""
    if model.is_file():
        return TAEHV.from_pretrained(model, variant=variant), model
    if not model.is_dir():
        raise FileNotFoundError(f"--model {model}: no such file or folder")
    for folder in (model / "final", model / "best_model", model):
        for name in ("taehv.safetensors", "taehv.pth"):
            if (folder / name).is_file():
                return TAEHV.from_pretrained(folder / name, variant=variant), folder / name
    from training.run.checkpoint_files import is_checkpoint_folder

    if is_checkpoint_folder(model):  # a training checkpoint: its EMA weights
        from scripts.convert_checkpoint import checkpoint_model

        return checkpoint_model(model, "ema", variant), model
    raise FileNotFoundError(f"--model {model}: no taehv.safetensors or taehv.pth in it, its final/ or best_model/, "
                            "and it is not a checkpoint folder")


def recorded_latent_space(weights: Path) -> str:
    """The latent space a trained model's model_info.json records (exports of distillation runs), else auto."""
    info = weights.parent / "model_info.json" if weights.is_file() else None
    if info is None or not info.is_file():
        return "auto"
    return json.loads(info.read_text()).get("reference", {}).get("latent_space", "auto")


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
    """The clips a training run held out (its resolved_config.json: data_root, index_path and
    validation_fraction, split by the same stable rule as training/data/clips.py)."""
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
    _, validation = read_index(source, data_root).split(config["validation_fraction"])
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


def code_version() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def pick_device(name: str) -> torch.device:
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------------


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
        out["peak_gpu_memory_gb"] = round(self.peak_bytes / 1e9, 3)  # GB of 1e9 bytes, as training/plan/memory.py if self.device.type == "cuda" else None
        return out


def frame_metrics(decoded: torch.Tensor, target: torch.Tensor, lpips) -> dict:
    """MSE, PSNR, SSIM, LPIPS (None when unavailable), flicker (None for one frame), per-frame PSNR
    and per-frame-pair flicker of one clip (N = 1)."""
    decoded, target = decoded.float(), target.float()
    pairs = temporal_error(decoded, target)[0].tolist() if decoded.shape[1] >= 2 else []
    return {
        "mse": (decoded - target).pow(2).mean().item(),
        "psnr": psnr(decoded, target).item(),
        "ssim": ssim(decoded, target).item(),
        "lpips": lpips(decoded, target).item() if lpips is not None else None,
        "flicker": sum(pairs) / len(pairs) if pairs else None,
        "per_frame_psnr": [round(psnr(decoded[:, t], target[:, t]).item(), 4) for t in range(decoded.shape[1])],
        "per_pair_flicker": [round(v, 6) for v in pairs],
    }


def evaluate_clip(video: torch.Tensor, student: TAEHV, reference, speeds: dict, lpips, dtype, streaming: bool) -> tuple[dict, torch.Tensor]:
    """Metrics for every mode, and the student's round trip (for the pictures)."""
    n_frames = video.shape[1]
    parallel = not streaming
    x = video.to(dtype)
    latents = speeds["student"].run("encode", n_frames, lambda: student.encode_video(x, parallel=parallel))
    decoded = speeds["student"].run("decode", n_frames, lambda: student.decode_video(latents, parallel=parallel)).float()
    metrics = {"frames": decoded.shape[1], **frame_metrics(decoded, video[:, : decoded.shape[1]], lpips)}
    if reference is not None:
        ref_latents = speeds["reference"].run("encode", n_frames, reference.encode, video)
        ref_decoded = speeds["reference"].run("decode", n_frames, reference.decode, ref_latents)
        student_decoded = student.decode_video(ref_latents.to(dtype), parallel=parallel).float()
        metrics["decode_reference_latents"] = frame_metrics(student_decoded, video[:, : student_decoded.shape[1]], lpips)
        metrics["reference_round_trip"] = frame_metrics(ref_decoded, video[:, : ref_decoded.shape[1]], lpips)
    return metrics, decoded


# ------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------


def side_by_side(video: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    """T,H,3W uint8: input | reconstruction | error x ERROR_GAIN."""
    target = video[0, : decoded.shape[1]].float().cpu()
    out = decoded[0].float().cpu()
    error = ((out - target).abs() * ERROR_GAIN).clamp(0, 1)
    panel = torch.cat([target, out, error], dim=-1)  # T,3,H,3W
    return (panel * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def write_mp4(path: Path, frames: torch.Tensor, fps: int = 8) -> None:
    """H.264 via PyAV, written under a temporary name and renamed when complete."""
    import av

    temporary = path.with_name(f".tmp-{path.name}")
    with av.open(str(temporary), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for frame in frames.numpy():
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    temporary.replace(path)


def write_contact_sheet(path: Path, panels: list[tuple[str, torch.Tensor]], height: int = 128) -> None:
    """One row per clip: the middle frame of its side-by-side panel, labelled."""
    from PIL import Image, ImageDraw

    rows = []
    for label, frames in panels:
        image = Image.fromarray(frames[frames.shape[0] // 2].numpy())
        image = image.resize((max(1, round(image.width * height / image.height)), height))
        canvas = Image.new("RGB", (image.width, height + 14), "white")
        canvas.paste(image, (0, 14))
        ImageDraw.Draw(canvas).text((2, 1), label, fill="black")
        rows.append(canvas)
    sheet = Image.new("RGB", (max(r.width for r in rows), sum(r.height for r in rows)), "white")
    y = 0
    for row in rows:
        sheet.paste(row, (0, y))
        y += row.height
    sheet.save(path)


def write_psnr_plot(path: Path, clips: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4))
    for clip in clips:
        axes.plot(clip["per_frame_psnr"], marker="o", markersize=3, label=Path(clip["path"]).name)
        if "decode_reference_latents" in clip:
            axes.plot(clip["decode_reference_latents"]["per_frame_psnr"], linestyle="--",
                      label=f"{Path(clip['path']).name} (reference latents)")
    axes.set_xlabel("frame")
    axes.set_ylabel("PSNR (dB)")
    axes.grid(alpha=0.3)
    if len(clips) <= 12:
        axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def number(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def write_markdown(path: Path, report: dict) -> None:
    model, mean = report["model"], report["mean"]
    inputs = report["inputs"]
    size = "native size" if inputs["native"] else f"{inputs['height']}x{inputs['width']}"
    lines = [f"# Evaluation of {model['path']}", "",
             f"Variant `{model['variant']}`, code {model['code_version']}, device {inputs['device']} ({inputs['dtype']}), "
             f"{inputs['frames']} frames at {size}{', streaming' if inputs['streaming'] else ''}.", "",
             "| mode | PSNR (dB) | SSIM | LPIPS | flicker |", "|---|---|---|---|---|",
             f"| student round trip | {number(mean['psnr'])} | {number(mean['ssim'], 4)} | {number(mean['lpips'], 4)} | "
             f"{number(mean['flicker'], 4)} |"]
    for key, name in (("decode_reference_latents", "student decode of reference latents"),
                      ("reference_round_trip", "reference VAE round trip")):
        if key in mean:
            lines.append(f"| {name} | {number(mean[key]['psnr'])} | {number(mean[key]['ssim'], 4)} | {number(mean[key]['lpips'], 4)} | "
                         f"{number(mean[key]['flicker'], 4)} |")
    if mean["per_position_psnr"]:
        positions = mean["per_position_psnr"]
        lines += ["", f"Student round trip, PSNR over all decoded frames: {number(mean['frame_mean_psnr'])} dB; by frame position:",
                  "", "| " + " | ".join(str(t) for t in range(len(positions))) + " |", "|---" * len(positions) + "|",
                  "| " + " | ".join(number(v, 1) for v in positions) + " |"]
    if mean["per_pair_flicker"]:
        pairs = mean["per_pair_flicker"]
        lines += ["", "Student round trip, flicker (RMSE of frame-to-frame changes, decoded vs input; 0 = changes "
                  "exactly as the input, lower is better) by frame pair:",
                  "", "| " + " | ".join(f"{t}-{t + 1}" for t in range(len(pairs))) + " |", "|---" * len(pairs) + "|",
                  "| " + " | ".join(number(v, 4) for v in pairs) + " |"]
    if mean["lpips"] is None:
        lines += ["", f"LPIPS: unavailable ({report['lpips_unavailable']})."]
    lines += ["", "| clip | status | frames | PSNR (dB) | SSIM | LPIPS | flicker |", "|---|---|---|---|---|---|---|"]
    for clip in report["clips"]:
        if clip["status"] == "ok":
            lines.append(f"| {clip['path']} | ok | {clip['frames']} | {number(clip['psnr'])} | {number(clip['ssim'], 4)} | "
                         f"{number(clip['lpips'], 4)} | {number(clip['flicker'], 4)} |")
        else:
            lines.append(f"| {clip['path']} | skipped: {clip['reason']} | | | | | |")
    lines += ["", "| model | encode frames/s | decode frames/s | peak GPU memory (GB) |", "|---|---|---|---|"]
    for name, speed in report["speed"].items():
        if isinstance(speed, dict):
            lines.append(f"| {name} | {number(speed['encode_frames_per_second'])} | "
                         f"{number(speed['decode_frames_per_second'])} | {number(speed['peak_gpu_memory_gb'])} |")
    lines += ["", "Pictures: `<clip>.mp4` (input | reconstruction | error x4), `contact_sheet.png`, `per_frame_psnr.png`.", ""]
    path.write_text("\n".join(lines))


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


def mean_of(clips: list[dict], key: str | None = None) -> dict:
    rows = [c[key] if key else c for c in clips]
    out = {}
    for metric in ("mse", "psnr", "ssim", "lpips", "flicker"):
        values = [r[metric] for r in rows if r[metric] is not None]
        out[metric] = sum(values) / len(values) if values and len(values) == len(rows) else None
    return out


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--variant", help="TAEHV variant, when the weights alone cannot tell")
    parser.add_argument("--videos", nargs="+", default=[], help="clip files, folders or indexes")
    parser.add_argument("--held-out-of", type=Path, metavar="RUN", help="evaluate the clips that training run held out")
    parser.add_argument("--num-samples", type=int, help="evaluate at most this many clips")
    parser.add_argument("--frames", type=int, default=17, help="frames per clip (the reference family's rule applies)")
    parser.add_argument("--stride", type=int, default=1, help="take every K-th frame")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=720)
    parser.add_argument("--native", action="store_true", help="each clip at its own size (see above)")
    parser.add_argument("--ref-vae", choices=("auto", *FAMILIES),
                        help="reference VAE family; auto (the default with --ref-vae-path) reads the class from its "
                        "config.json and measures a class no family names")
    parser.add_argument("--ref-vae-path", help="local diffusers folder or hub id of the reference VAE")
    parser.add_argument("--ref-vae-latent-space", choices=("auto", "raw", "scaled", "normalized"),
                        help="latent space of the reference latents the student decodes (default: the one the model's "
                        "model_info.json records, else auto = the family's public TAEHV space)")
    parser.add_argument("--streaming", action="store_true", help="frame-by-frame path: memory constant in T")
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), or a torch device")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32", help="student precision")
    parser.add_argument("--lpips-backbone", default="", help="AlexNet file for LPIPS (default: torch hub cache)")
    parser.add_argument("--lpips-heads", default="", help="LPIPS v0.1 alex.pth (default: torch hub cache)")
    parser.add_argument("--no-media", action="store_true", help="skip the mp4s and pictures (report files only)")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def check_args(args) -> str | None:
    """A one-line problem with the arguments, found before any model or video is loaded."""
    if bool(args.videos) == bool(args.held_out_of):
        return "give --videos or --held-out-of RUN (one of them)"
    if args.ref_vae and not args.ref_vae_path:
        return "--ref-vae needs --ref-vae-path (a local diffusers folder or a hub id)"
    if args.ref_vae_path:
        from models import reference_families, vae_geometry

        try:
            args.ref_vae, args.ref_vae_geometry = vae_geometry.identify(args.ref_vae or "auto", args.ref_vae_path)
        except ValueError as error:
            return str(error)
        frames = (vae_geometry.valid_frame_counts(args.ref_vae_geometry, limit=50) if args.ref_vae_geometry
                  else reference_families.valid_frame_counts(args.ref_vae, 50))
        if args.frames not in frames:
            return f"--frames {args.frames} does not suit the {args.ref_vae} VAE: use one of {frames}"
    if args.frames < 1 or args.stride < 1:
        return "--frames and --stride must be at least 1"
    if not args.native and (args.height % 8 or args.width % 8 or args.height < 8 or args.width < 8):
        return f"--height {args.height} --width {args.width}: use positive multiples of 8 (or --native)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check_args(args)
    device = pick_device(args.device)
    try:
        if problem:
            raise ValueError(problem)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            student, weights = load_student(args.model, args.variant)
        for warning in caught:  # e.g. weights whose variant cannot be told: one line each, without source lines
            print(f"warning: {warning.message}", file=sys.stderr)
        paths = clip_paths(args.videos) if args.videos else held_out_clips(args.held_out_of)
        reference = None
        if args.ref_vae:
            from models.reference_vae import load_reference_vae

            reference = load_reference_vae(args.ref_vae, args.ref_vae_path, device, sample_latents=False,
                                           latent_space=args.ref_vae_latent_space or recorded_latent_space(weights),
                                           geometry=args.ref_vae_geometry)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    student = student.to(device=device, dtype=DTYPES[args.dtype]).eval()
    if not args.native and (args.height % (8 * student.patch_size) or args.width % (8 * student.patch_size)):
        print(f"error: --height/--width must be multiples of {8 * student.patch_size} for {student.variant}", file=sys.stderr)
        return 2
    try:
        lpips, lpips_unavailable = load_lpips(args.lpips_backbone, args.lpips_heads, device), None
    except LPIPSUnavailable as error:
        lpips, lpips_unavailable = None, str(error)
    args.out.mkdir(parents=True, exist_ok=True)
    speeds = {"student": Speed(device)}
    if reference is not None:
        speeds["reference"] = Speed(device)

    paths = paths[: args.num_samples]
    clips, panels, start = [], [], time.perf_counter()
    progress = paths
    if sys.stderr.isatty():
        from tqdm import tqdm

        progress = tqdm(paths, unit="clip")
    for clip_number, path in enumerate(progress):
        entry = {"path": str(path)}
        try:
            height, width = native_size(path, 8 * student.patch_size) if args.native else (args.height, args.width)
            frames, _, _ = read_clip(path, -1, args.frames, args.stride, args.stride, random.Random(0), loop_short=False,
                                  cover=(height, width))
        except ClipError as error:
            clips.append({**entry, "status": "skipped", "reason": error.reason})
            continue
        video = resize_and_crop(torch.from_numpy(frames).permute(0, 3, 1, 2), height, width, rng=None)[0]
        video = video[None].to(device).float() / 255
        metrics, decoded = evaluate_clip(video, student, reference, speeds, lpips, DTYPES[args.dtype], args.streaming)
        clip = {**entry, "status": "ok", "height": height, "width": width, **metrics}
        if not args.no_media:
            panel = side_by_side(video, decoded)
            clip["side_by_side"] = f"clip_{clip_number:04d}_{path.stem}.mp4"
            write_mp4(args.out / clip["side_by_side"], panel)
            panels.append((f"{path.name}  {metrics['psnr']:.2f} dB", panel))
        clips.append(clip)
    evaluated = [c for c in clips if c["status"] == "ok"]
    mean = mean_of(evaluated) if evaluated else {"mse": None, "psnr": None, "ssim": None, "lpips": None, "flicker": None}
    mean.update(frame_position_means(evaluated))
    if reference is not None and evaluated:
        mean["decode_reference_latents"] = mean_of(evaluated, "decode_reference_latents")
        mean["reference_round_trip"] = mean_of(evaluated, "reference_round_trip")
    report = {
        "model": {"path": str(weights), "variant": student.variant, "args": student.args.to_json_dict(),
                  "code_version": code_version()},
        "inputs": {"videos": args.videos or f"held out by {args.held_out_of}", "clips_found": len(paths), "frames": args.frames, "stride": args.stride,
                   "height": args.height, "width": args.width, "native": args.native, "streaming": args.streaming,
                   "device": str(device), "dtype": args.dtype, "reference_vae": args.ref_vae,
                   "reference_vae_path": args.ref_vae_path},
        "clips": clips,
        "mean": mean,
        "lpips_unavailable": lpips_unavailable,
        "speed": {**{name: speed.summary() for name, speed in speeds.items()},
                  "peak_process_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)},
        "seconds": round(time.perf_counter() - start, 2),
    }
    temporary = args.out / ".report.json.tmp"
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    temporary.replace(args.out / "report.json")
    write_markdown(args.out / "report.md", report)
    if panels:
        write_contact_sheet(args.out / "contact_sheet.png", panels)
        write_psnr_plot(args.out / "per_frame_psnr.png", evaluated)
    for clip in clips:
        detail = f"{clip['psnr']:.2f} dB" if clip["status"] == "ok" else f"skipped: {clip['reason']}"
        print(f"{detail:24s} {clip['path']}")
    print(f"{len(evaluated)} of {len(clips)} clips evaluated; mean PSNR {number(mean['psnr'])} dB "
          f"(over all decoded frames {number(mean['frame_mean_psnr'])} dB), SSIM {number(mean['ssim'], 4)}, "
          f"LPIPS {number(mean['lpips'], 4)}, flicker {number(mean['flicker'], 4)}")
    if mean["per_position_psnr"]:
        print("PSNR by frame position: " + " ".join(f"{v:.1f}" for v in mean["per_position_psnr"]) + " dB")
    if mean["per_pair_flicker"]:
        print("flicker by frame pair: " + " ".join(f"{v:.4f}" for v in mean["per_pair_flicker"]))
    print(f"report: {args.out / 'report.md'} (and report.json)")
    if panels:
        print(f"contact sheet: {args.out / 'contact_sheet.png'}; per-frame plot: {args.out / 'per_frame_psnr.png'}")
    return 0 if evaluated else 1


if __name__ == "__main__":
    sys.exit(main())
