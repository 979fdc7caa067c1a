"""inference.py end to end: a model trained a few steps and a spec-shaped random public file, real
clips (synthetic, plus ../shared's odd ones when present), every --model kind, the reference-VAE
modes, the colour and motion metrics beside the 8x8 block-average baseline, --compare, and the
report files."""

import contextlib
import io
import json
import os
import random
import subprocess
import sys
from unittest import mock

import pytest
import torch
from conftest import REPO_ROOT, SAMPLE_VIDEOS, free_port

from models.evaluation import clip_metrics
from models.metrics import (
    block_average,
    chroma_psnr,
    colourfulness,
    luma_psnr,
    psnr,
    save_random_lpips_weights,
    ssim,
    temporal_error,
    warping_error,
)
from models.reference_vae import tiny_reference_vae_config, vae_class
from models.taehv import TAEHV
from training.data.synthetic_clips import make_sample_videos
from training.data.decode import read_clip, resize_and_crop
from training.data.index import read_index


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Clips (three good, one broken) and a run folder from a real 4-step training run."""
    root = tmp_path_factory.mktemp("inference")
    videos = root / "videos"
    make_sample_videos(videos, count=3, n_frames=24)
    (videos / "broken.mp4").write_bytes(b"not a video")
    run = root / "run"
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    trained = subprocess.run([str(REPO_ROOT / "train_taehv_h100.sh"), "1", "test", "--output-dir", str(run),
                              "--set", f"data_root={videos}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=400)
    assert trained.returncode == 0, trained.stderr[-3000:]
    return root, videos, run


def run_inference(*args, torch_home=None) -> subprocess.CompletedProcess:
    """`python inference.py ARGS` as its main in this process: the same command line, exit code and
    both streams, without a new interpreter importing torch again for each of this file's calls."""
    import inference

    argv = [str(arg) for arg in args]
    stdout, stderr = io.StringIO(), io.StringIO()
    # sys.argv too: argparse names the program after it in its usage lines
    with mock.patch.dict(os.environ, {"TORCH_HOME": str(torch_home)} if torch_home else {}), \
            mock.patch.object(sys, "argv", ["inference.py", *argv]), \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = inference.main(argv)
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code
    return subprocess.CompletedProcess(["inference.py", *args], code, stdout.getvalue(), stderr.getvalue())


def decoded_by_hand(model_file, clip, frames=9, height=32, width=48):
    model = TAEHV.from_pretrained(model_file).eval()
    raw, _, _ = read_clip(clip, -1, frames, 1, 1, random.Random(0), False, cover=(height, width))
    video = resize_and_crop(torch.from_numpy(raw).permute(0, 3, 1, 2), height, width, None)[0][None].float() / 255
    with torch.no_grad():
        decoded = model.decode_video(model.encode_video(video))
    return decoded, video[:, : decoded.shape[1]]


def test_report_fields_metrics_pictures_and_skips(setup, tmp_path):
    root, videos, run = setup
    torch_home = tmp_path / "torch_home"
    save_random_lpips_weights(torch_home / "hub" / "checkpoints")  # stands in for the real files
    out = tmp_path / "eval"
    result = run_inference("--model", str(run), "--videos", str(videos), "--frames", "9", "--height", "32",
                           "--width", "48", "--out", str(out), torch_home=torch_home)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["variant"] == "taehv" and report["model"]["path"].endswith("final/taehv.safetensors")
    # stderr: the settings first, then a bar per clip whose last state is its outcome (minutes per clip on a CPU at 480x720)
    lines = result.stderr.splitlines()  # tqdm's \r updates split too: each line is one state of a bar
    assert lines[0] == (f"inference.py: model {report['model']['path']} (taehv), 4 clips, 9 frames (stride 1) at 32x48, "
                        f"device cpu, fp32; writing to {out}")
    ends = {line.split(":")[0]: line for line in lines[1:] if line.startswith("clip ")}  # each bar's last state
    assert len(ends) == 4 and ends["clip 1/4 broken.mp4"].endswith("skipped: open_error"), ends
    assert all("5/5 stages" in line and line.endswith(" dB") for name, line in ends.items() if "broken" not in name), ends
    assert any(line.endswith("student encode + decode") for line in lines)  # the stage running now is named
    assert report["model"]["args"]["patch_size"] == 1 and report["model"]["code_version"]
    ok = [c for c in report["clips"] if c["status"] == "ok"]
    skipped = [c for c in report["clips"] if c["status"] == "skipped"]
    assert len(ok) == 3 and skipped == [{"path": str(videos / "broken.mp4"), "status": "skipped", "reason": "open_error"}]
    # PSNR and SSIM equal a computation on the same decoded tensors
    first = next(c for c in ok if c["path"].endswith("sample_0000.mp4"))
    decoded, target = decoded_by_hand(run / "final" / "taehv.pth", videos / "sample_0000.mp4")
    expected_psnr = (10 * torch.log10(1 / ((decoded - target) ** 2).mean())).item()
    assert first["psnr"] == pytest.approx(expected_psnr, abs=1e-3)
    assert first["ssim"] == pytest.approx(ssim(decoded, target).item(), abs=1e-4)
    assert first["frames"] == 9 == len(first["per_frame_psnr"])
    assert first["per_frame_psnr"][0] == pytest.approx(psnr(decoded[:, 0], target[:, 0]).item(), abs=1e-3)
    assert first["lpips"] > 0 and report["lpips_unavailable"] is None
    # flicker per frame pair and per clip, from the same tensors
    pairs = temporal_error(decoded, target)[0]
    assert len(first["per_pair_flicker"]) == 8 and first["per_pair_flicker"][3] == pytest.approx(pairs[3].item(), abs=1e-5)
    assert first["flicker"] == pytest.approx(pairs.mean().item(), abs=1e-5) and first["flicker"] > 0
    for metric in ("psnr", "ssim", "lpips", "flicker"):
        assert report["mean"][metric] == pytest.approx(sum(c[metric] for c in ok) / 3)
    assert report["speed"]["student"]["encode_frames_per_second"] > 0
    for clip in ok:
        assert (out / clip["side_by_side"]).stat().st_size > 1000
    assert (out / "contact_sheet.png").stat().st_size > 1000 and (out / "per_frame_psnr.png").stat().st_size > 1000
    markdown = (out / "report.md").read_text()
    assert f"| student round trip | {report['mean']['psnr']:.2f} |" in markdown and "skipped: open_error" in markdown
    assert f"| {report['mean']['lpips']:.4f} | {report['mean']['flicker']:.4f} |" in markdown
    assert f"| {first['lpips']:.4f} | {first['flicker']:.4f} |" in markdown  # the clip's row
    # colour and motion, from the same tensors
    assert first["luma_psnr"] == pytest.approx(luma_psnr(decoded, target).item(), abs=1e-3)
    assert first["chroma_psnr"] == pytest.approx(chroma_psnr(decoded, target).item(), abs=1e-3)
    assert first["colourfulness_ratio"] == pytest.approx((colourfulness(decoded) / colourfulness(target)).item(), rel=1e-4)
    assert first["warping_error"] == pytest.approx(warping_error(decoded, target).item(), abs=1e-4)
    assert first["source_warping_error"] == pytest.approx(warping_error(target, target).item(), abs=1e-4)
    # the 8x8 block average of the same frames, scored the same way
    baseline = first["block_average_8x8"]
    assert baseline["psnr"] == pytest.approx(psnr(block_average(target), target).item(), abs=1e-3)
    assert baseline["chroma_psnr"] == pytest.approx(chroma_psnr(block_average(target), target).item(), abs=1e-3)
    assert baseline["warping_error"] == pytest.approx(warping_error(block_average(target), target).item(), abs=1e-4)
    assert 0 < baseline["colourfulness_ratio"] < 1 and baseline["lpips"] > 0
    mean = report["mean"]
    for metric in ("luma_psnr", "chroma_psnr", "warping_error"):
        assert mean[metric] == pytest.approx(sum(c[metric] for c in ok) / 3)
        assert report["baseline"]["mean"][metric] == pytest.approx(sum(c["block_average_8x8"][metric] for c in ok) / 3)
    assert mean["colourfulness_ratio"] == pytest.approx(mean["colourfulness"] / mean["source_colourfulness"])
    assert report["speed"]["block_average_8x8"]["decode_frames_per_second"] > 0 and report["warping_error_unavailable"] is None
    assert report["baseline"]["name"] == "8x8 block average" and report["baseline"]["block"] == 8
    loses = [key for key in ("psnr", "chroma_psnr", "colourfulness_ratio") if mean[key] < report["baseline"]["mean"][key]]
    assert any("loses to the 8x8 block average" in note for note in report["notes"]) == bool(loses)
    assert (f"| student round trip | {mean['psnr']:.2f} | {mean['ssim']:.4f} | {mean['lpips']:.4f} | {mean['flicker']:.4f} | "
            f"{mean['warping_error']:.4f} | {mean['luma_psnr']:.2f} | {mean['chroma_psnr']:.2f} | {mean['colourfulness_ratio']:.2f} |") in markdown
    assert f"| 8x8 block average (baseline) | {report['baseline']['mean']['psnr']:.2f} |" in markdown
    assert f"| {first['path']} | {baseline['psnr']:.2f} |" in markdown  # the baseline's row of the clip
    assert f"8x8 block average (baseline), same frames: PSNR {report['baseline']['mean']['psnr']:.2f} dB" in result.stdout
    assert f"chroma PSNR {mean['chroma_psnr']:.2f} dB, colourfulness ratio {mean['colourfulness_ratio']:.2f}" in result.stdout


def test_help_shows_every_default():
    import inference

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), pytest.raises(SystemExit):
        inference.parse_args(["--help"])
    text = " ".join(stdout.getvalue().split("options:")[1].split())  # the options' help, unwrapped
    for option, default in (("--frames FRAMES", 17), ("--height HEIGHT", 480), ("--width WIDTH", 720), ("--stride STRIDE", 1),
                            ("--device DEVICE", "auto"), ("--dtype {fp32,bf16,fp16}", "fp32")):
        assert option in text and f"(default: {default})" in text.split(option, 1)[1].split(" --", 1)[0], option
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "--num-samples 20 \\" in stdout.getvalue()  # the examples as written (a continued line stays continued)


def test_side_by_side_panels_in_order():
    """input | reference VAE | reconstruction | error x4 over the frames all have; without a reference,
    input | reconstruction | others | error x4."""
    from scripts.evaluation_report import ERROR_GAIN, side_by_side

    video, ours, theirs, blurred = (torch.full((1, 5, 3, 8, 8), v) for v in (0.5, 0.45, 0.3, 0.2))
    picture = side_by_side(video, ours[:, :4], reference=theirs)
    assert picture.shape == (4, 8, 4 * 8, 3)
    expected = [0.5, 0.3, 0.45, 0.05 * ERROR_GAIN]
    assert [round(picture[0, 0, 8 * i, 0].item() / 255, 2) for i in range(4)] == expected
    picture = side_by_side(video, ours, blurred)
    assert [round(picture[0, 0, 8 * i, 0].item() / 255, 2) for i in range(4)] == [0.5, 0.45, 0.2, 0.05 * ERROR_GAIN]


def test_side_by_side_video_shows_input_reconstruction_and_error(setup, tmp_path):
    import av

    root, videos, run = setup
    out = tmp_path / "eval"
    result = run_inference("--model", str(run), "--videos", str(videos / "sample_0001.mp4"), "--frames", "9",
                           "--height", "32", "--width", "48", "--out", str(out), torch_home=tmp_path / "no_lpips")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["mean"]["lpips"] is None and "not found" in report["lpips_unavailable"]  # unavailable, not a number
    assert "LPIPS: unavailable" in (out / "report.md").read_text()
    with av.open(str(out / report["clips"][0]["side_by_side"])) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 9 and frames[0].shape == (32, 3 * 48, 3)


def test_streaming_agrees_and_every_model_path_kind_loads(setup, tmp_path):
    root, videos, run = setup
    common = ["--videos", str(videos / "sample_0001.mp4"), "--frames", "9", "--height", "32", "--width", "48", "--no-media"]
    checkpoint = sorted((run / "checkpoints").glob("checkpoint-*"))[-1]
    results = {}
    kinds = {"run": run, "final": run / "final", "best": run / "best_model", "checkpoint": checkpoint,
             "file": run / "final" / "taehv.pth"}
    for name, model in kinds.items():
        extra = ["--streaming"] if name == "file" else []
        out = tmp_path / name
        completed = run_inference("--model", str(model), *common, *extra, "--out", str(out))
        assert completed.returncode == 0, completed.stderr
        results[name] = json.loads((out / "report.json").read_text())["mean"]["psnr"]
    # the last checkpoint's EMA is what final/ exported; streaming agrees with parallel
    assert results["run"] == results["final"] == results["checkpoint"]
    assert results["file"] == pytest.approx(results["run"], abs=1e-3)
    assert results["best"] > 0
    missing = run_inference("--model", str(tmp_path), *common, "--out", str(tmp_path / "x"))
    assert missing.returncode == 2 and "no TAEHV weight file (<variant>.safetensors or .pth)" in missing.stderr
    nothing = run_inference("--model", str(run), "--videos", str(videos / "broken.mp4"), "--out", str(tmp_path / "y"))
    assert nothing.returncode == 1


def test_public_format_file_needs_variant_only_when_ambiguous(setup, tmp_path):
    root, videos, run = setup
    torch.manual_seed(0)
    public = tmp_path / "taecvx.pth"
    torch.save(TAEHV("taecvx").state_dict(), public)  # no model_info.json beside it
    common = ["--videos", str(videos / "sample_0002.mp4"), "--frames", "9", "--height", "32", "--width", "48", "--no-media"]
    result = run_inference("--model", str(public), *common, "--out", str(tmp_path / "a"))
    assert result.returncode == 0, result.stderr
    # the public file name tells taecvx (and its trim rule) among the variants with these shapes
    assert json.loads((tmp_path / "a" / "report.json").read_text())["model"]["variant"] == "taecvx"
    assert "warning" not in result.stderr
    anonymous = tmp_path / "weights.pth"
    anonymous.write_bytes(public.read_bytes())
    result = run_inference("--model", str(anonymous), *common, "--out", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "d" / "report.json").read_text())["model"]["variant"] == "taehv"
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "taecvx" in warning[0] and "--variant" in warning[0]
    result = run_inference("--model", str(public), "--variant", "taecvx", *common, "--out", str(tmp_path / "b"))
    assert json.loads((tmp_path / "b" / "report.json").read_text())["model"]["variant"] == "taecvx"
    wrong = run_inference("--model", str(public), "--variant", "taehv1_5", *common, "--out", str(tmp_path / "c"))
    assert wrong.returncode == 2 and "taehv1_5" in wrong.stderr and "\n" == wrong.stderr[-1]


def test_reference_vae_modes(setup, tmp_path):
    root, videos, run = setup
    torch.manual_seed(0)
    folder = tmp_path / "cogvideox"
    vae_class("cogvideox")(**tiny_reference_vae_config("cogvideox")).save_pretrained(str(folder / "vae"))
    torch.save(TAEHV("taecvx").state_dict(), tmp_path / "taecvx.pth")
    args = ["--model", str(tmp_path / "taecvx.pth"), "--variant", "taecvx", "--videos", str(videos / "sample_0000.mp4"),
            "--height", "32", "--width", "48", "--ref-vae", "cogvideox", "--ref-vae-path", str(folder)]
    bad = run_inference(*args, "--frames", "13", "--no-media", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "--frames 13 does not suit the cogvideox VAE: use one of [9, 17" in bad.stderr
    result = run_inference(*args, "--frames", "9", "--out", str(tmp_path / "ok"))
    assert result.returncode == 0, result.stderr
    assert f"reference VAE cogvideox ({folder})" in result.stderr.splitlines()[0]
    assert "9/9 stages" in result.stderr and "reference decode" in result.stderr
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    # the reference VAE's reconstruction is in the side-by-side video: input | reference VAE | ours | error x4
    import av

    with av.open(str(tmp_path / "ok" / report["clips"][0]["side_by_side"])) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 9 and frames[0].shape == (32, 4 * 48, 3)
    assert "(input | reference VAE | reconstruction | error x4)" in (tmp_path / "ok" / "report.md").read_text()
    clip = report["clips"][0]
    for mode in ("decode_reference_latents", "reference_round_trip"):
        assert len(clip[mode]["per_frame_psnr"]) == 9 and clip[mode]["psnr"] > 0
        assert len(clip[mode]["per_pair_flicker"]) == 8 and clip[mode]["flicker"] > 0
        assert report["mean"][mode]["psnr"] == pytest.approx(clip[mode]["psnr"])
    assert report["speed"]["reference"]["decode_frames_per_second"] > 0
    assert "| reference VAE round trip |" in (tmp_path / "ok" / "report.md").read_text()


def test_native_size_rounds_down_to_the_patch_grid(setup, tmp_path):
    """The synthetic clips are 96x128, 128x96, 96x96, ...; plus ../shared's small odd-sized ones when
    present (320x180 rounds to 320x176; the 3-frame rotated clip is too short and is skipped)."""
    root, videos, run = setup
    shared = [SAMPLE_VIDEOS / name for name in ("nasa_13013.mp4", "cheesecake_256.mp4", "rotated_90.mov")]
    sources = [str(videos)] + [str(p) for p in shared if p.is_file()]
    result = run_inference("--model", str(run), "--videos", *sources, "--frames", "5", "--native", "--no-media",
                           "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    ok = [c for c in report["clips"] if c["status"] == "ok"]
    assert len(ok) >= 3
    assert all(c["height"] % 8 == 0 and c["width"] % 8 == 0 for c in ok)
    sizes = {(c["height"], c["width"]) for c in ok}
    assert len(sizes) > 1  # each clip at its own size
    by_name = {c["path"].rsplit("/", 1)[-1]: c for c in report["clips"]}
    if "nasa_13013.mp4" in by_name:
        assert (by_name["nasa_13013.mp4"]["height"], by_name["nasa_13013.mp4"]["width"]) == (176, 320)
        assert by_name["rotated_90.mov"]["status"] == "skipped" and by_name["rotated_90.mov"]["reason"] == "too_short"


def test_held_out_clips_of_a_run_by_frame_position(setup, tmp_path):
    """`--held-out-of RUN` evaluates what that run held out (the demo's self-evaluation), and the
    report gives PSNR over all decoded frames and by frame position (temporal slot)."""
    root, videos, run = setup
    _, validation = read_index(videos).split(json.loads((run / "resolved_config.json").read_text())["validation_fraction"])
    expected = sorted(str(validation.path(i)) for i in range(len(validation)))
    result = run_inference("--model", str(run), "--held-out-of", str(run), "--frames", "8", "--height", "32",
                           "--width", "32", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert sorted(c["path"] for c in report["clips"]) == expected and expected
    ok = [c for c in report["clips"] if c["status"] == "ok"]
    every_frame = [v for c in ok for v in c["per_frame_psnr"]]
    assert report["mean"]["frame_mean_psnr"] == pytest.approx(sum(every_frame) / len(every_frame))
    positions = report["mean"]["per_position_psnr"]
    assert len(positions) == 5  # 8 frames = 2 latents, 5 frames back
    assert positions[0] == pytest.approx(sum(c["per_frame_psnr"][0] for c in ok) / len(ok), abs=1e-3)
    pairs = report["mean"]["per_pair_flicker"]
    assert len(pairs) == 4 and pairs[1] == pytest.approx(sum(c["per_pair_flicker"][1] for c in ok) / len(ok), abs=1e-5)
    markdown = (tmp_path / "report.md").read_text()
    assert "by frame position" in markdown and "by frame pair" in markdown and "| 0-1 | 1-2 | 2-3 | 3-4 |" in markdown
    assert "flicker by frame pair:" in result.stdout
    assert "PSNR by frame position:" in result.stdout and f"contact sheet: {tmp_path / 'contact_sheet.png'}" in result.stdout
    missing = run_inference("--model", str(run), "--held-out-of", str(videos), "--out", str(tmp_path / "x"))
    assert missing.returncode == 2 and "no resolved_config.json" in missing.stderr
    neither = run_inference("--model", str(run), "--out", str(tmp_path / "y"))
    assert neither.returncode == 2 and "give --videos or --held-out-of RUN" in neither.stderr


def test_a_grey_reconstruction_is_named_grey(setup, tmp_path):
    """Weights whose three output channels are one: luma can be right, colour never is."""
    root, videos, run = setup
    model = TAEHV.from_pretrained(run / "final" / "taehv.pth")
    last = model.decoder[-1]
    with torch.no_grad():
        last.weight[1:] = last.weight[:1]
        last.bias[1:] = last.bias[:1]
    torch.save(model.state_dict(), tmp_path / "taehv.pth")
    result = run_inference("--model", str(tmp_path / "taehv.pth"), "--videos", str(videos / "sample_0000.mp4"), "--frames", "9",
                           "--height", "32", "--width", "48", "--no-media", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["mean"]["colourfulness_ratio"] < 0.01 and report["baseline"]["mean"]["colourfulness_ratio"] > 0.3
    grey = [note for note in report["notes"] if "GREY" in note]
    assert grey == [f"student round trip is GREY: it keeps {report['mean']['colourfulness_ratio']:.2f} of the source's "
                    "colourfulness (below 0.5)"]
    assert f"- **{grey[0]}**" in (tmp_path / "out" / "report.md").read_text() and f"note: {grey[0]}" in result.stdout


def test_compare_scores_several_models_on_the_same_clips_in_one_table_and_chart(setup, tmp_path, capsys):
    """A trained run, a random public taecvx file, the reference VAE's own round trip and the 8x8
    block average on the same two clips: compare.json, compare.md and compare.png; each model's
    numbers are those of its own decode of those clips."""
    root, videos, run = setup
    torch.manual_seed(0)
    vae_class("cogvideox")(**tiny_reference_vae_config("cogvideox")).save_pretrained(str(tmp_path / "cogvideox" / "vae"))
    torch.save(TAEHV("taecvx").state_dict(), tmp_path / "taecvx.pth")
    clips = [str(videos / "sample_0000.mp4"), str(videos / "sample_0001.mp4"), str(videos / "broken.mp4")]
    common = ["--videos", *clips, "--frames", "9", "--height", "32", "--width", "32", "--out", str(tmp_path / "out")]
    result = run_inference("--compare", str(run), str(tmp_path / "taecvx.pth"), "reference", "--ref-vae-path",
                           str(tmp_path / "cogvideox"), *common)
    assert result.returncode == 0, result.stderr
    table = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert [(m["name"], m["kind"]) for m in table["models"]] == [
        (str(run), "taehv"), (str(tmp_path / "taecvx.pth"), "taehv"), ("reference", "reference"), ("8x8 block average", "baseline")]
    assert table["clips"] == clips[:2] and table["skipped"] == [{"path": clips[2], "reason": "open_error"}]
    for model in table["models"]:
        assert [c["path"] for c in model["clips"]] == clips[:2]
        assert model["speed"]["decode_frames_per_second"] > 0 and model["mean"]["psnr"] > 0
        assert model["mean"]["chroma_psnr"] > 0 and model["mean"]["warping_error"] > 0
    trained, public, reference, baseline = table["models"]
    assert public["variant"] == "taecvx" and trained["variant"] == "taehv" and reference["family"] == "cogvideox"
    decoded, target = decoded_by_hand(run / "final" / "taehv.pth", videos / "sample_0001.mp4", width=32)
    assert trained["clips"][1]["psnr"] == pytest.approx(psnr(decoded, target).item(), abs=1e-3)
    assert trained["clips"][1]["warping_error"] == pytest.approx(warping_error(decoded, target).item(), abs=1e-4)
    expected = clip_metrics(block_average(target), target)  # the baseline keeps every frame: 9 here too
    assert baseline["clips"][1]["chroma_psnr"] == pytest.approx(expected["chroma_psnr"], abs=1e-3)
    markdown = (tmp_path / "out" / "compare.md").read_text()
    for model in table["models"]:
        assert f"| {model['name']} |" in markdown and f"| {model['mean']['chroma_psnr']:.2f} |" in markdown
    assert "decode frames/s" in markdown and markdown in result.stdout
    assert (tmp_path / "out" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "out" / "compare.png").stat().st_size > 10000
    # a reference round trip needs the reference, and one model option at a time: one line, before any loading
    import inference

    no_videos = common[1 + len(clips):]
    for args, message in ((["--compare", str(run), "reference", *common], "error: --compare reference needs --ref-vae-path"),
                          (["--model", str(run), "--compare", str(run), *common], "error: give --model MODEL or --compare MODEL"),
                          (["--compare", str(run), *no_videos], "error: give --videos or --held-out-of RUN"),
                          # a reference VAE that is not here: its download in one line, not diffusers' retries
                          (["--compare", str(run), "reference", "--ref-vae-path", str(tmp_path / "CogVideoX-2b"), *common],
                           f"error: --ref-vae-path {tmp_path / 'CogVideoX-2b'} is not a local folder: put the diffusers cogvideox "
                           f"pipeline in a local folder and set --ref-vae-path to it (e.g. hf download THUDM/CogVideoX-2b "
                           f"--include 'vae/*' --local-dir {tmp_path / 'CogVideoX-2b'})"),
                          (["--compare", str(run), "reference", "--ref-vae-path", "no-such-org/Wan2.1-vae", *common],
                           "error: --ref-vae-path no-such-org/Wan2.1-vae is no local folder and not in the Hugging Face cache")):
        capsys.readouterr()
        assert inference.main(args) == 2
        assert capsys.readouterr().err.startswith(message)


def test_the_docs_pictures_of_a_run_are_drawn_from_what_make_demo_writes(setup, tmp_path):
    """`python -m scripts.evaluation_report --pictures DEST RUN`: the contact sheet of the run's
    evaluation (its first clips), held-out PSNR at each validation from validation_history.json, and
    the --compare chart, each a PNG under 100 KB; the demo's Makefile target writes what it reads."""
    import re
    import shutil

    from PIL import Image

    from scripts.evaluation_report import (
        LABEL_BAND,
        PICTURE_BYTES,
        SHEET_ROW,
        SHEET_SOURCES,
        main,
        psnr_series,
        write_validation_plot,
    )

    root, videos, run = setup
    demo = tmp_path / "run"  # the run's records, and what make demo's evaluations add to them
    demo.mkdir()
    for name in ("validation_history.json", "resolved_config.json"):
        shutil.copy(run / name, demo / name)
    common = ["--videos", videos / "sample_0000.mp4", videos / "sample_0001.mp4", "--frames", "8", "--height", "32", "--width", "32"]
    assert run_inference("--model", run, *common, "--out", demo / "evaluation").returncode == 0
    assert run_inference("--compare", run, *common, "--out", demo / "compare").returncode == 0
    out = tmp_path / "images"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["--pictures", str(out), str(demo)]) == 0
    for name in ("contact_sheet.png", "psnr_vs_step.png", "compare.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 1000 < len(data) < PICTURE_BYTES, name
        assert f"{out / name} (" in stdout.getvalue()
    assert Image.open(out / "contact_sheet.png").height == LABEL_BAND + 2 * (SHEET_ROW + LABEL_BAND)  # title, 2 clips
    history = json.loads((run / "validation_history.json").read_text())
    plotted = write_validation_plot(tmp_path / "plot.png", history, "32x32")
    assert plotted == psnr_series(history) and plotted["psnr"] == [(h["step"], h["psnr"]) for h in history]
    assert [step for step, _ in plotted["psnr"]] == [2, 4]
    # make demo writes what the pictures are drawn from, then draws them
    demo_target = (REPO_ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    outs = re.findall(r"--out output/latest/(\S+)", demo_target)
    assert SHEET_SOURCES[0] in outs and "compare" in outs and "--compare" in demo_target
    assert demo_target.rstrip().endswith("-m scripts.evaluation_report --pictures output/latest/pictures output/latest")
    # nothing to draw from: the missing ones named, exit 1
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        assert main(["--pictures", str(tmp_path / "none"), str(tmp_path / "empty")]) == 1
    assert stderr.getvalue().count("not made: ") == 3
