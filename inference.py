r"""Evaluate a TAEHV model on real videos, optionally against the reference VAE it was distilled
from, beside an 8x8 block average of the same frames; or compare several models on the same clips.

    python inference.py --model output/latest --videos /data/eval_clips --num-samples 20 \
        --frames 17 --height 480 --width 720 --out eval/
    python inference.py --model checkpoints/taecvx.pth --videos clips/ --native --frames 17 \
        --ref-vae cogvideox --ref-vae-path /models/CogVideoX-2b --out eval_vs_ref/
    python inference.py --compare output/latest taehv.pth reference --ref-vae-path /models/Wan2.1 \
        --videos clips/ --frames 17 --height 480 --width 832 --device cuda --out compare/

--model: a run folder (final/, else best_model/), an export folder (final/, best_model/), a
checkpoint folder (checkpoints/checkpoint-N: its EMA weights), or a public-format .pth /
.safetensors file (--variant when neither the file nor a model_info.json beside it can tell).
--compare MODEL...: instead of --model, several such models (and `reference`: the reference VAE's
    own round trip, with --ref-vae-path) on the same clips: one table (compare.md, compare.json)
    and one chart (compare.png) of quality against decode frames/s on --device.
--videos: files, folders, or an index (JSONL/CSV/annotation JSON) in the data pipeline's formats.
--held-out-of RUN: instead of --videos, the clips training run RUN held out from its data (the
    demo evaluates itself with `--held-out-of output/latest`).
--native: each clip at its own size, rounded down to a multiple of 8 x the variant's patch size.

Writes to --out: report.json (layout in docs/evaluation.md), report.md, per clip a side-by-side
mp4 (input | reconstruction | error x4; with --ref-vae input | reference VAE | reconstruction |
error x4), per_frame_psnr.png and contact_sheet.png. Every report has luma and chroma PSNR, the
colourfulness ratio, flicker and the warping error, for the model and for the 8x8 block-average
baseline. On stderr: the settings in one line, then a progress bar per clip, one step per stage
(read, the round trip, the metrics, ...: a 17-frame 480x720 clip takes minutes on a CPU).
Unreadable clips are skipped with their reason; the exit code is non-zero only if nothing could be
evaluated (2 for a bad argument, 1 for no clip evaluated).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

from models.evaluation import (
    BASELINE,
    BASELINE_BLOCK,
    BASELINE_NAME,
    SourceWarps,
    Speed,
    block_average_round_trip,
    clip_metrics,
    frame_position_means,
    mean_of,
    notes,
)
from models.metrics import opencv_missing
from models.public_files import lpips_files_hint, missing_lpips_files
from models.reference_families import FAMILIES
from models.taehv import TAEHV
from scripts.evaluation_inputs import (
    DTYPES,
    REFERENCE,
    clip_paths,
    code_version,
    held_out_clips,
    load_model,
    lpips_or_reason,
    read_video,
    student_round_trip,
)
from training.base.fast_exit import exit_now
from training.data.decode import ClipError


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------


def recorded_latent_space(weights: Path) -> str:
    """The latent space a trained model's model_info.json records (exports of distillation runs), else auto."""
    info = weights.parent / "model_info.json" if weights.is_file() else None
    if info is None or not info.is_file():
        return "auto"
    return json.loads(info.read_text()).get("reference", {}).get("latent_space", "auto")


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


class ClipProgress:
    """One progress bar per clip on stderr (tqdm), one step per stage of its evaluation, the stage
    running now after the bar: a stage of a 17-frame 480x720 clip takes a minute or more on a CPU."""

    def __init__(self, label: str, reference: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=len(clip_stages(reference)), desc=label, unit="stage", file=sys.stderr, leave=True,
                        mininterval=0, bar_format="{desc}: {n}/{total} stages |{bar:12}| {elapsed}{postfix}")

    def run(self, stage: str, function, *args):
        self.bar.set_postfix_str(stage)
        result = function(*args)
        self.bar.update(1)
        return result

    def close(self, outcome: str = "done") -> None:
        self.bar.set_postfix_str(outcome)
        self.bar.close()


def clip_stages(reference: bool) -> list[str]:
    """The stages of one clip's evaluation, in order (evaluate_clip runs them)."""
    stages = ["read", "student encode + decode", "metrics", "block average", "block average metrics"]
    if reference:
        stages += ["reference encode", "reference decode", "student decode of reference latents", "reference metrics"]
    return stages


def evaluate_clip(video: torch.Tensor, student: TAEHV, reference, speeds: dict, lpips, dtype, streaming: bool,
                  progress: ClipProgress) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Metrics for every mode and for the 8x8 block average of the same frames; the student's round
    trip, the baseline's and the reference VAE's (None without one), for the pictures."""
    stage, names = progress.run, iter(clip_stages(reference is not None)[1:])
    warps = SourceWarps(video)  # the source's flow, once per clip for every mode
    decoded = stage(next(names), student_round_trip, student, video, speeds["student"], dtype, streaming)
    target = video[:, : decoded.shape[1]]
    metrics = {"frames": decoded.shape[1], **stage(next(names), clip_metrics, decoded, target, lpips, warps)}
    baseline = stage(next(names), block_average_round_trip, target, speeds[BASELINE])
    metrics[BASELINE] = stage(next(names), clip_metrics, baseline, target, lpips, warps)
    ref_decoded = None
    if reference is not None:
        ref_latents = stage(next(names), speeds["reference"].run, "encode", video.shape[1], reference.encode, video)
        ref_decoded = stage(next(names), speeds["reference"].run, "decode", video.shape[1], reference.decode, ref_latents)

        def decode_reference_latents():
            with torch.no_grad():
                return student.decode_video(ref_latents.to(dtype), parallel=not streaming).float()

        student_decoded = stage(next(names), decode_reference_latents)

        def reference_metrics():
            return {"decode_reference_latents": clip_metrics(student_decoded, video[:, : student_decoded.shape[1]], lpips, warps),
                    "reference_round_trip": clip_metrics(ref_decoded, video[:, : ref_decoded.shape[1]], lpips, warps)}

        metrics.update(stage(next(names), reference_metrics))
    return metrics, decoded, baseline, ref_decoded


def settings_line(args, student: TAEHV, weights: Path, device: torch.device, clips: int) -> str:
    """What this evaluation runs, in one line: the first a person sees, before minutes of work."""
    size = "its native size" if args.native else f"{args.height}x{args.width}"
    reference = f"; reference VAE {args.ref_vae} ({args.ref_vae_path})" if args.ref_vae else ""
    return (f"inference.py: model {weights} ({student.variant}), {clips} clip{'s' * (clips != 1)}, {args.frames} frames "
            f"(stride {args.stride}) at {size}, device {device}, {args.dtype}{', streaming' if args.streaming else ''}"
            f"{reference}; writing to {args.out}")


# ------------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------------


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and each option's default after its help (not for flags, nor for
    options whose default is nothing: their help says what happens then)."""

    def _get_help_string(self, action):
        if action.default in (None, False, "", []):
            return action.help
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", type=Path, help="the model to evaluate (see above)")
    parser.add_argument("--compare", nargs="+", metavar="MODEL",
                        help=f"instead of --model: several models (as --model takes them, or `{REFERENCE}` for the "
                        "reference VAE's round trip) on the same clips; a table and a chart of quality against speed")
    parser.add_argument("--variant", help="TAEHV variant, when the weights alone cannot tell (every --compare file)")
    parser.add_argument("--videos", nargs="+", default=[], help="clip files, folders or indexes")
    parser.add_argument("--held-out-of", type=Path, metavar="RUN", help="evaluate the clips that training run held out")
    parser.add_argument("--num-samples", type=int, help="evaluate at most this many clips")
    parser.add_argument("--frames", type=int, default=17, help="frames per clip (the reference family's rule applies)")
    parser.add_argument("--stride", type=int, default=1, help="take every K-th frame")
    parser.add_argument("--height", type=int, default=480, help="frame height (a multiple of 8 x the patch size)")
    parser.add_argument("--width", type=int, default=720, help="frame width (a multiple of 8 x the patch size)")
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
    parser.add_argument("--out", type=Path, required=True, help="folder for the report and the pictures")
    return parser.parse_args(argv)


def check_args(args) -> str | None:
    """A one-line problem with the arguments, found before any model or video is loaded."""
    if (args.model is None) == (args.compare is None):
        return "give --model MODEL or --compare MODEL [MODEL ...] (one of them)"
    if bool(args.videos) == bool(args.held_out_of):
        return "give --videos or --held-out-of RUN (one of them)"
    if args.ref_vae and not args.ref_vae_path:
        return "--ref-vae needs --ref-vae-path (a local diffusers folder or a hub id)"
    if args.compare and (REFERENCE in args.compare) != bool(args.ref_vae_path):
        return (f"--compare {REFERENCE} needs --ref-vae-path (the reference VAE whose round trip it is)" if args.ref_vae_path is None
                else f"--ref-vae-path with --compare: name `{REFERENCE}` among the --compare models to evaluate its round trip")
    if args.ref_vae_path:
        from models import reference_families, vae_geometry
        from training.config.inputs import reference_vae_path_problem

        # a missing folder or an uncached hub id: one line with its download, not diffusers' own retries and message
        problem = reference_vae_path_problem("" if args.ref_vae in (None, "auto") else args.ref_vae, args.ref_vae_path,
                                             "--ref-vae-path", f"--ref-vae-path {args.ref_vae_path}",
                                             lambda folder: f"--ref-vae-path {folder}")
        if problem:
            return problem

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
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.compare:
        from scripts.compare_models import compare

        return compare(args, device)
    try:
        student, weights = load_model(args.model, args.variant)
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
    from scripts.evaluation_report import print_summary, side_by_side, write_contact_sheet, write_json, write_markdown, write_mp4, write_psnr_plot

    lpips, lpips_unavailable = lpips_or_reason(args, device)
    if lpips_unavailable:  # where the files come from, and the commands that fetch them
        lpips_unavailable += "; " + lpips_files_hint(missing_lpips_files(args.lpips_backbone, args.lpips_heads, torch.hub.get_dir()))
    args.out.mkdir(parents=True, exist_ok=True)
    speeds = {"student": Speed(device), BASELINE: Speed(device)}
    if reference is not None:
        speeds["reference"] = Speed(device)

    paths = paths[: args.num_samples]
    print(settings_line(args, student, weights, device, len(paths)), file=sys.stderr, flush=True)
    clips, sheet, start = [], [], time.perf_counter()
    for clip_number, path in enumerate(paths):
        entry = {"path": str(path)}
        progress = ClipProgress(f"clip {clip_number + 1}/{len(paths)} {path.name}", reference is not None)
        try:
            height, width, video = progress.run("read", read_video, path, args, 8 * student.patch_size, device)
        except ClipError as error:
            progress.close(f"skipped: {error.reason}")
            clips.append({**entry, "status": "skipped", "reason": error.reason})
            continue
        metrics, decoded, blurred, ref_decoded = evaluate_clip(video, student, reference, speeds, lpips, DTYPES[args.dtype],
                                                               args.streaming, progress)
        progress.close(f"{metrics['psnr']:.2f} dB")
        clip = {**entry, "status": "ok", "height": height, "width": width, **metrics}
        if not args.no_media:
            clip["side_by_side"] = f"clip_{clip_number:04d}_{path.stem}.mp4"
            write_mp4(args.out / clip["side_by_side"], side_by_side(video, decoded, reference=ref_decoded))
            middle = slice(decoded.shape[1] // 2, decoded.shape[1] // 2 + 1)
            label = (f"{path.name}  {metrics['psnr']:.2f} dB, chroma {metrics['chroma_psnr']:.2f} dB "
                     f"(block average {metrics[BASELINE]['psnr']:.2f}, {metrics[BASELINE]['chroma_psnr']:.2f})")
            middle_reference = ref_decoded[:, middle] if ref_decoded is not None else None
            sheet.append((label, side_by_side(video[:, middle], decoded[:, middle], blurred[:, middle], reference=middle_reference)[0]))
        clips.append(clip)
    evaluated = [c for c in clips if c["status"] == "ok"]
    mean = {**mean_of(evaluated), **frame_position_means(evaluated)}
    modes = {"student round trip": mean}
    baseline = {"name": BASELINE_NAME, "block": BASELINE_BLOCK, "mean": mean_of([c[BASELINE] for c in evaluated])}
    if evaluated and reference is not None:
        for key, name in (("decode_reference_latents", "student decode of reference latents"),
                          ("reference_round_trip", "reference VAE round trip")):
            mean[key] = modes[name] = mean_of([c[key] for c in evaluated])
    report = {
        "model": {"path": str(weights), "variant": student.variant, "args": student.args.to_json_dict(),
                  "code_version": code_version()},
        "inputs": {"videos": args.videos or f"held out by {args.held_out_of}", "clips_found": len(paths), "frames": args.frames, "stride": args.stride,
                   "height": args.height, "width": args.width, "native": args.native, "streaming": args.streaming,
                   "device": str(device), "dtype": args.dtype, "reference_vae": args.ref_vae,
                   "reference_vae_path": args.ref_vae_path},
        "clips": clips,
        "mean": mean,
        "baseline": baseline,
        "notes": notes(modes, baseline["mean"]) if evaluated else [],
        "lpips_unavailable": lpips_unavailable,
        "warping_error_unavailable": opencv_missing(),
        "speed": {**{name: speed.summary() for name, speed in speeds.items()},
                  "peak_process_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)},
        "seconds": round(time.perf_counter() - start, 2),
    }
    write_json(args.out / "report.json", report)
    write_markdown(args.out / "report.md", report)
    if sheet:
        panels = f"input | {'reference VAE | ' if reference is not None else ''}reconstruction | {BASELINE_NAME} | error x4"
        write_contact_sheet(args.out / "contact_sheet.png", sheet, panels)
        write_psnr_plot(args.out / "per_frame_psnr.png", evaluated)
    print_summary(report, args.out, bool(sheet))
    return 0 if evaluated else 1


if __name__ == "__main__":
    exit_now(main())
