"""The files and lines inference.py writes for one model: report.json, report.md, the printed
summary, the side-by-side mp4s, the contact sheet and the per-frame PSNR plot (layout in
docs/evaluation.md). A helper of inference.py, not a command of its own."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from models.evaluation import BASELINE, BASELINE_NAME

ERROR_GAIN = 4  # the error panel shows |reconstruction - input| x 4
MODES = (("decode_reference_latents", "student decode of reference latents"), ("reference_round_trip", "reference VAE round trip"))
# the columns of every metric table after the name: (key, header, digits)
COLUMNS = (("psnr", "PSNR (dB)", 2), ("ssim", "SSIM", 4), ("lpips", "LPIPS", 4), ("flicker", "flicker", 4),
           ("warping_error", "warping error", 4), ("luma_psnr", "luma PSNR (dB)", 2), ("chroma_psnr", "chroma PSNR (dB)", 2),
           ("colourfulness_ratio", "colourfulness ratio", 2))


def number(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def header(first: list[str]) -> list[str]:
    names = first + [name for _, name, _ in COLUMNS]
    return ["| " + " | ".join(names) + " |", "|---" * len(names) + "|"]


def row(first: list[str], values: dict) -> str:
    return "| " + " | ".join(first + [number(values.get(key), digits) for key, _, digits in COLUMNS]) + " |"


def write_json(path: Path, data: dict) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    temporary.replace(path)


def write_markdown(path: Path, report: dict) -> None:
    model, mean, inputs = report["model"], report["mean"], report["inputs"]
    size = "native size" if inputs["native"] else f"{inputs['height']}x{inputs['width']}"
    lines = [f"# Evaluation of {model['path']}", "",
             f"Variant `{model['variant']}`, code {model['code_version']}, device {inputs['device']} ({inputs['dtype']}), "
             f"{inputs['frames']} frames at {size}{', streaming' if inputs['streaming'] else ''}.", "",
             *header(["mode"]), row(["student round trip"], mean)]
    lines += [row([name], mean[key]) for key, name in MODES if key in mean]
    lines.append(row([f"{BASELINE_NAME} (baseline)"], report["baseline"]["mean"]))
    lines += ["", f"Baseline: the {BASELINE_NAME} of each decoded frame (average-pooled by 8, bilinear back up: 3 numbers "
              "per 64 pixels, fewer than a TAE latent keeps), scored on the same frames. Warping error of the source "
              f"itself (what a perfect reconstruction scores; a blur can score below it): "
              f"{number(mean.get('source_warping_error'), 4)}."]
    if report.get("warping_error_unavailable"):
        lines += ["", f"Warping error: unavailable ({report['warping_error_unavailable']})."]
    if report.get("notes"):
        lines += ["", "Notes:", ""] + [f"- **{note}**" for note in report["notes"]]
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
    lines += ["", "Student round trip per clip:", "", *header(["clip", "status", "frames"])]
    for clip in report["clips"]:
        if clip["status"] == "ok":
            lines.append(row([clip["path"], "ok", str(clip["frames"])], clip))
        else:
            lines.append("| " + " | ".join([clip["path"], f"skipped: {clip['reason']}"] + [""] * (len(COLUMNS) + 1)) + " |")
    evaluated = [clip for clip in report["clips"] if clip["status"] == "ok" and BASELINE in clip]
    if evaluated:
        lines += ["", f"{BASELINE_NAME} (baseline) per clip, on the same frames:", "", *header(["clip"])]
        lines += [row([clip["path"]], clip[BASELINE]) for clip in evaluated]
    lines += ["", "| model | encode frames/s | decode frames/s | peak GPU memory (GB) |", "|---|---|---|---|"]
    for name, speed in report["speed"].items():
        if isinstance(speed, dict):
            lines.append(f"| {BASELINE_NAME if name == BASELINE else name} | {number(speed['encode_frames_per_second'])} | "
                         f"{number(speed['decode_frames_per_second'])} | {number(speed['peak_gpu_memory_gb'])} |")
    ref = "reference VAE | " if "reference_round_trip" in mean else ""
    lines += ["", f"Pictures: `<clip>.mp4` (input | {ref}reconstruction | error x4), `contact_sheet.png` (input | {ref}"
              f"reconstruction | {BASELINE_NAME} | error x4), `per_frame_psnr.png`.", ""]
    path.write_text("\n".join(lines))


def colour_and_motion(values: dict) -> str:
    return (f"luma PSNR {number(values['luma_psnr'])} dB, chroma PSNR {number(values['chroma_psnr'])} dB, "
            f"colourfulness ratio {number(values['colourfulness_ratio'])}, warping error {number(values['warping_error'], 4)}")


def print_summary(report: dict, out: Path, pictures: bool) -> None:
    mean, clips = report["mean"], report["clips"]
    evaluated = [clip for clip in clips if clip["status"] == "ok"]
    for clip in clips:
        detail = (f"{clip['psnr']:.2f} dB, chroma {number(clip['chroma_psnr'])} dB, colour x{number(clip['colourfulness_ratio'])}"
                  if clip["status"] == "ok" else f"skipped: {clip['reason']}")
        print(f"{detail:44s} {clip['path']}")
    print(f"{len(evaluated)} of {len(clips)} clips evaluated; mean PSNR {number(mean['psnr'])} dB "
          f"(over all decoded frames {number(mean['frame_mean_psnr'])} dB), SSIM {number(mean['ssim'], 4)}, "
          f"LPIPS {number(mean['lpips'], 4)}, flicker {number(mean['flicker'], 4)}")
    if evaluated:
        print(f"  {colour_and_motion(mean)} (the source itself {number(mean['source_warping_error'], 4)})")
    if evaluated:
        baseline = report["baseline"]["mean"]
        print(f"{BASELINE_NAME} (baseline), same frames: PSNR {number(baseline['psnr'])} dB, SSIM {number(baseline['ssim'], 4)}, "
              f"flicker {number(baseline['flicker'], 4)}\n  {colour_and_motion(baseline)}")
    for note in report.get("notes", []):
        print(f"note: {note}")
    if mean["per_position_psnr"]:
        print("PSNR by frame position: " + " ".join(f"{v:.1f}" for v in mean["per_position_psnr"]) + " dB")
    if mean["per_pair_flicker"]:
        print("flicker by frame pair: " + " ".join(f"{v:.4f}" for v in mean["per_pair_flicker"]))
    print(f"report: {out / 'report.md'} (and report.json)")
    if pictures:
        print(f"contact sheet: {out / 'contact_sheet.png'}; per-frame plot: {out / 'per_frame_psnr.png'}")


# ------------------------------------------------------------------------------------------------
# Pictures
# ------------------------------------------------------------------------------------------------


def side_by_side(video: torch.Tensor, decoded: torch.Tensor, *others: torch.Tensor,
                 reference: torch.Tensor | None = None) -> torch.Tensor:
    """T,H,kW uint8 from 1,T,3,H,W in [0, 1]: input | reference VAE (when given) | reconstruction |
    others... | the reconstruction's error x ERROR_GAIN, over the frames all of them have."""
    frames = min(t.shape[1] for t in (video, decoded, *others, *([reference] if reference is not None else [])))
    target = video[0, :frames].float().cpu()
    out = decoded[0, :frames].float().cpu()
    error = ((out - target).abs() * ERROR_GAIN).clamp(0, 1)
    before = [reference[0, :frames].float().cpu().clamp(0, 1)] if reference is not None else []
    panel = torch.cat([target, *before, out, *(o[0, :frames].float().cpu().clamp(0, 1) for o in others), error], dim=-1)
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


def write_contact_sheet(path: Path, rows: list[tuple[str, torch.Tensor]], title: str = "", height: int = 128) -> None:
    """One row per clip: a labelled H,W,3 uint8 picture, scaled to `height`; `title` on top."""
    from PIL import Image, ImageDraw

    pictures = []
    for label, picture in rows:
        image = Image.fromarray(picture.numpy())
        image = image.resize((max(1, round(image.width * height / image.height)), height))
        canvas = Image.new("RGB", (image.width, height + 14), "white")
        canvas.paste(image, (0, 14))
        ImageDraw.Draw(canvas).text((2, 1), label, fill="black")
        pictures.append(canvas)
    top = 14 if title else 0
    sheet = Image.new("RGB", (max(p.width for p in pictures), top + sum(p.height for p in pictures)), "white")
    if title:
        ImageDraw.Draw(sheet).text((2, 1), title, fill="black")
    y = top
    for picture in pictures:
        sheet.paste(picture, (0, y))
        y += picture.height
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
