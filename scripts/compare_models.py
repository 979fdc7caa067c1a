"""`inference.py --compare MODEL [MODEL ...]`: several models on the same clips and frames, with the
8x8 block average as a baseline row, in one table (compare.md, compare.json) and one chart
(compare.png) of quality (PSNR, chroma PSNR, warping error, LPIPS when available) against decode
frames/s on the named device, the plot the Flash-VAED and Turbo-VAED papers publish. A MODEL is
anything --model takes (run, export or checkpoint folder, public-format file) or `reference`, the
reference VAE's own round trip (--ref-vae-path). A helper of inference.py, not a command of its own.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from models.evaluation import BASELINE_NAME, SourceWarps, Speed, block_average_round_trip, clip_metrics, mean_of, notes
from models.metrics import opencv_missing
from scripts.evaluation_inputs import (
    DTYPES,
    REFERENCE,
    clip_paths,
    code_version,
    held_out_clips,
    load_model,
    lpips_or_reason,
    progress_over,
    read_video,
    student_round_trip,
)
from scripts.evaluation_report import number, write_json

# the chart's panels: (key, axis label, higher is better)
CHART = (("psnr", "PSNR (dB)", True), ("chroma_psnr", "chroma PSNR (dB)", True),
         ("warping_error", "warping error", False), ("lpips", "LPIPS", False))
# the table's columns after the model: (key, header, digits)
TABLE = (("psnr", "PSNR (dB)", 2), ("luma_psnr", "luma PSNR (dB)", 2), ("chroma_psnr", "chroma PSNR (dB)", 2),
         ("ssim", "SSIM", 4), ("lpips", "LPIPS", 4), ("flicker", "flicker", 4), ("warping_error", "warping error", 4),
         ("colourfulness_ratio", "colourfulness ratio", 2))


@dataclass
class Contender:
    """One compared model: how it reconstructs a clip (timed by `speed`) and what it scored."""

    name: str  # as given on the command line
    kind: str  # taehv, reference or baseline
    info: dict
    multiple: int  # frame sizes it takes are multiples of this
    round_trip: Callable[[torch.Tensor, Speed], torch.Tensor]
    speed: Speed
    clips: list = field(default_factory=list)


def taehv_contender(name: str, args, device: torch.device) -> Contender:
    model, weights = load_model(Path(name), args.variant)
    model = model.to(device=device, dtype=DTYPES[args.dtype]).eval()
    info = {"path": str(weights), "variant": model.variant, "parameters": sum(p.numel() for p in model.parameters()),
            "decoder_parameters": sum(p.numel() for p in model.decoder.parameters()), "dtype": args.dtype}
    return Contender(name, "taehv", info, 8 * model.patch_size,
                     lambda video, speed: student_round_trip(model, video, speed, DTYPES[args.dtype], args.streaming),
                     Speed(device))


def reference_contender(args, device: torch.device) -> Contender:
    from models.reference_vae import load_reference_vae

    reference = load_reference_vae(args.ref_vae, args.ref_vae_path, device, sample_latents=False,
                                   geometry=args.ref_vae_geometry)

    def round_trip(video: torch.Tensor, speed: Speed) -> torch.Tensor:
        latents = speed.run("encode", video.shape[1], reference.encode, video)
        return speed.run("decode", video.shape[1], reference.decode, latents).float()

    info = {"path": args.ref_vae_path, "family": args.ref_vae, "parameters": sum(p.numel() for p in reference.parameters()),
            "dtype": str(reference.dtype).removeprefix("torch.")}
    return Contender("reference", "reference", info, 8, round_trip, Speed(device))


def baseline_contender(device: torch.device) -> Contender:
    return Contender(BASELINE_NAME, "baseline", {"parameters": 0}, 8, block_average_round_trip, Speed(device))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}, {torch.get_num_threads()} threads"


def compare(args, device: torch.device) -> int:
    """Load every model, read each clip once, reconstruct it with each (a first untimed round trip
    per model warms it up), then write the table, the JSON and the chart. Exit codes as inference.py."""
    from training.data.decode import ClipError

    try:
        contenders = [reference_contender(args, device) if name == REFERENCE else taehv_contender(name, args, device)
                      for name in args.compare]
        paths = clip_paths(args.videos) if args.videos else held_out_clips(args.held_out_of)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    contenders.append(baseline_contender(device))
    multiple = math.lcm(*(c.multiple for c in contenders))
    if not args.native and (args.height % multiple or args.width % multiple):
        print(f"error: --height/--width must be multiples of {multiple} for {', '.join(args.compare)}", file=sys.stderr)
        return 2
    lpips, lpips_unavailable = lpips_or_reason(args, device)
    args.out.mkdir(parents=True, exist_ok=True)
    paths, skipped, evaluated, warmed, start = paths[: args.num_samples], [], [], False, time.perf_counter()
    for path in progress_over(paths):
        try:
            _, _, video = read_video(path, args, multiple, device)
        except ClipError as error:
            skipped.append({"path": str(path), "reason": error.reason})
            continue
        if not warmed:  # first calls pay for allocation and kernel selection: not what a user's decode costs
            for contender in contenders:
                contender.round_trip(video, Speed(device))
            warmed = True
        warps = SourceWarps(video)
        for contender in contenders:
            decoded = contender.round_trip(video, contender.speed)
            metrics = clip_metrics(decoded, video[:, : decoded.shape[1]], lpips, warps)
            contender.clips.append({"path": str(path), "frames": decoded.shape[1], **metrics})
        evaluated.append(str(path))
    models = [{"name": c.name, "kind": c.kind, **c.info, "mean": mean_of(c.clips) if c.clips else None,
               "speed": c.speed.summary(), "clips": c.clips} for c in contenders]
    result = {
        "inputs": {"videos": args.videos or f"held out by {args.held_out_of}", "clips_found": len(paths), "frames": args.frames,
                   "stride": args.stride, "height": args.height, "width": args.width, "native": args.native,
                   "streaming": args.streaming, "device": str(device), "device_name": device_name(device), "dtype": args.dtype,
                   "code_version": code_version()},
        "clips": evaluated,
        "skipped": skipped,
        "models": models,
        "notes": notes({m["name"]: m["mean"] for m in models if m["kind"] != "baseline" and m["mean"]},
                       models[-1]["mean"]) if evaluated else [],
        "lpips_unavailable": lpips_unavailable,
        "warping_error_unavailable": opencv_missing(),
        "peak_process_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "seconds": round(time.perf_counter() - start, 2),
    }
    write_json(args.out / "compare.json", result)
    markdown = compare_markdown(result)
    (args.out / "compare.md").write_text(markdown)
    if evaluated:
        write_chart(args.out / "compare.png", result)
    print(markdown)
    print(f"table: {args.out / 'compare.md'} (and compare.json)" + (f"; chart: {args.out / 'compare.png'}" if evaluated else ""))
    return 0 if evaluated else 1


def compare_markdown(result: dict) -> str:
    inputs = result["inputs"]
    size = "native size" if inputs["native"] else f"{inputs['height']}x{inputs['width']}"
    names = ["model", "kind", "parameters"] + [header for _, header, _ in TABLE] + ["decode frames/s", "encode frames/s"]
    lines = [f"# Model comparison on {len(result['clips'])} clips", "",
             f"{inputs['frames']} frames at {size}, device {inputs['device_name']} ({inputs['device']}, TAEHV in "
             f"{inputs['dtype']}), code {inputs['code_version']}. Each model is scored on the frames it decodes; speed "
             "is timed around each call after one warm-up round trip.", "",
             "| " + " | ".join(names) + " |", "|---" * len(names) + "|"]
    for model in result["models"]:
        mean, speed = model["mean"] or {}, model["speed"]
        cells = [model["name"], model["kind"] if model["kind"] != "taehv" else model["variant"], f"{model['parameters']:,}"]
        cells += [number(mean.get(key), digits) for key, _, digits in TABLE]
        cells += [number(speed["decode_frames_per_second"], 1), number(speed["encode_frames_per_second"], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    for what, reason in (("LPIPS", result["lpips_unavailable"]), ("Warping error", result["warping_error_unavailable"])):
        if reason:
            lines += ["", f"{what}: unavailable ({reason})."]
    if result["notes"]:
        lines += ["", "Notes:", ""] + [f"- **{note}**" for note in result["notes"]]
    if result["skipped"]:
        lines += ["", "Skipped: " + ", ".join(f"{s['path']} ({s['reason']})" for s in result["skipped"]) + "."]
    return "\n".join(lines) + "\n"


def write_chart(path: Path, result: dict) -> None:
    """One panel per quality metric (LPIPS only when measured) against decode frames/s (log scale),
    each model a labelled point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in result["models"] if m["mean"] and m["speed"]["decode_frames_per_second"]]
    panels = [p for p in CHART if any(m["mean"].get(p[0]) is not None for m in models)]
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for axis, (key, label, higher) in zip(axes[0], panels):
        for model in models:
            value = model["mean"].get(key)
            if value is None:
                continue
            speed = model["speed"]["decode_frames_per_second"]
            marker = "s" if model["kind"] == "baseline" else "^" if model["kind"] == "reference" else "o"
            axis.scatter(speed, value, marker=marker, s=40)
            axis.annotate(model["name"], (speed, value), fontsize=7,
                          xytext=(4, 4), textcoords="offset points")
        axis.set_xscale("log")
        axis.set_xlabel(f"decode frames/s ({result['inputs']['device_name']})")
        axis.set_ylabel(f"{label} ({'higher' if higher else 'lower'} is better)")
        axis.grid(alpha=0.3, which="both")
    inputs = result["inputs"]
    size = "native size" if inputs["native"] else f"{inputs['height']}x{inputs['width']}"
    figure.suptitle(f"{len(result['clips'])} clips, {inputs['frames']} frames at {size}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
