"""The files and lines inference.py writes for one model: report.json, report.md, the printed
summary, the side-by-side mp4s, the contact sheet and the per-frame PSNR plot (layout in
docs/evaluation.md). A helper of inference.py; as a command, the pictures the docs show, from a run
that `make demo` made (each PNG under 100 KB):

    python -m scripts.evaluation_report --pictures docs/images output/latest

writes contact_sheet.png (the first held-out clips of the run's evaluation), psnr_vs_step.png (its
held-out PSNR at each validation, beside the 8x8 block average's) and compare.png (its
`inference.py --compare` chart), each from what the run folder holds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
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


LABEL_BAND = 14  # pixels of text above each row of a contact sheet, and above the sheet for its title
SHEET_ROW = 128  # the height of a contact sheet's pictures


def write_contact_sheet(path: Path, rows: list[tuple[str, torch.Tensor]], title: str = "", height: int = SHEET_ROW) -> None:
    """One row per clip: a labelled H,W,3 uint8 picture, scaled to `height`; `title` on top."""
    from PIL import Image, ImageDraw

    pictures = []
    for label, picture in rows:
        image = Image.fromarray(picture.numpy())
        image = image.resize((max(1, round(image.width * height / image.height)), height))
        canvas = Image.new("RGB", (image.width, height + LABEL_BAND), "white")
        canvas.paste(image, (0, LABEL_BAND))
        ImageDraw.Draw(canvas).text((2, 1), label, fill="black")
        pictures.append(canvas)
    top = LABEL_BAND if title else 0
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


# ------------------------------------------------------------------------------------------------
# The docs' pictures of a run (python -m scripts.evaluation_report --pictures DEST RUN)
# ------------------------------------------------------------------------------------------------

PICTURE_BYTES = 100_000  # each picture the docs commit stays under this
DOCS_SHEET_ROWS = 4  # clips in the docs' contact sheet
# the run's evaluations a contact sheet is taken from, the first found (make demo writes both)
SHEET_SOURCES = ("evaluation_64x64", "evaluation")
VALIDATION_PSNR = re.compile(r"^(decode_)?psnr$|^\d+x\d+_(block_average_)?psnr$")  # the PSNR series of validation_history.json


def save_small(image, path: Path, limit: int = PICTURE_BYTES) -> None:
    """A PNG under `limit` bytes: the picture in a palette of 256, then fewer colours, then smaller."""
    from PIL import Image

    image = image.convert("RGB")
    while True:
        for colours in (256, 128, 64, 32):
            image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
            if path.stat().st_size < limit:
                return
        image = image.resize((max(1, image.width * 3 // 4), max(1, image.height * 3 // 4)), Image.Resampling.LANCZOS)


def contact_sheet_rows(path: Path, rows: int = DOCS_SHEET_ROWS):
    """The title and the first `rows` clips of a contact sheet write_contact_sheet wrote (at SHEET_ROW)."""
    from PIL import Image

    image = Image.open(path)
    return image.crop((0, 0, image.width, min(image.height, LABEL_BAND + rows * (SHEET_ROW + LABEL_BAND))))


def psnr_series(history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Each PSNR a validation reported (the training size's, `decode_` of the reference latents, each
    validation size's and its block average's) -> (step, dB) at every validation that has it."""
    keys = [key for key in dict.fromkeys(k for entry in history for k in entry) if VALIDATION_PSNR.match(key)]
    return {key: [(entry["step"], entry[key]) for entry in history if entry.get(key) is not None] for key in keys}


def series_label(key: str, size: str) -> str:
    name = {"psnr": f"{size} round trip", "decode_psnr": f"{size} decode of reference latents"}.get(key)
    if name:
        return name
    scale, _, what = key.partition("_")
    return f"{scale} {'8x8 block average' if what.startswith('block_average') else 'round trip'}"


def write_validation_plot(path: Path, history: list[dict], size: str) -> dict[str, list[tuple[int, float]]]:
    """Held-out PSNR against the step of each validation (a block average dashed); the series plotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = psnr_series(history)
    figure, axes = plt.subplots(figsize=(6.4, 3.4))
    colours = {}  # one colour per size: a size's block average in its round trip's colour
    for key, points in series.items():
        steps, values = zip(*points)
        scale = key.split("_")[0] if key[0].isdigit() else key
        colour = colours.setdefault(scale, f"C{len(colours)}")
        axes.plot(steps, values, linestyle="--" if "block_average" in key else "-", marker="o", markersize=3,
                  color=colour, label=series_label(key, size))
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("held-out PSNR (dB)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return series


def write_pictures(out: Path, run: Path) -> tuple[list[Path], list[str]]:
    """The docs' pictures of `run` into `out`: (the files written, one line per picture not made)."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    written, missing = [], []
    sheet = next((run / name / "contact_sheet.png" for name in SHEET_SOURCES if (run / name / "contact_sheet.png").is_file()), None)
    if sheet is not None:
        save_small(contact_sheet_rows(sheet), out / "contact_sheet.png")
        written.append(out / "contact_sheet.png")
    else:
        missing.append(f"contact_sheet.png: no {' or '.join(f'{run / n}/contact_sheet.png' for n in SHEET_SOURCES)} "
                       f"(inference.py --model {run} --held-out-of {run} --out {run / 'evaluation'} writes one)")
    history = run / "validation_history.json"
    entries = json.loads(history.read_text()) if history.is_file() else []
    if any(psnr_series(entries).values()):
        config = json.loads((run / "resolved_config.json").read_text()) if (run / "resolved_config.json").is_file() else {}
        size = f"{config['height']}x{config['width']}" if "height" in config else "training size"
        write_validation_plot(out / "psnr_vs_step.png", entries, size)
        save_small(Image.open(out / "psnr_vs_step.png"), out / "psnr_vs_step.png")
        written.append(out / "psnr_vs_step.png")
    else:
        missing.append(f"psnr_vs_step.png: no validation with a PSNR in {history}")
    chart = run / "compare" / "compare.png"
    if chart.is_file():
        save_small(Image.open(chart), out / "compare.png")
        written.append(out / "compare.png")
    else:
        missing.append(f"compare.png: no {chart} (inference.py --compare {run} --held-out-of {run} --out {run / 'compare'} writes it)")
    return written, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pictures", type=Path, required=True, metavar="DEST", help="folder for the pictures")
    parser.add_argument("run", type=Path, help="a run folder make demo made (output/latest)")
    args = parser.parse_args(argv)
    written, missing = write_pictures(args.pictures, args.run)
    for path in written:
        print(f"{path} ({path.stat().st_size / 1000:.0f} KB)")
    for line in missing:
        print(f"not made: {line}", file=sys.stderr)
    return 0 if written else 1


if __name__ == "__main__":
    raise SystemExit(main())
