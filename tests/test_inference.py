import json
import random
import subprocess
import sys

import pytest
import torch

from conftest import REPO_ROOT
from models.taehv import TAEHV, write_model_info
from scripts.make_sample_videos import make_sample_videos
from training.dataset import read_clip, resize_and_crop


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference")
    videos = root / "videos"
    make_sample_videos(videos, count=3, n_frames=24)
    (videos / "broken.mp4").write_bytes(b"not a video")
    run = root / "run"
    (run / "final").mkdir(parents=True)
    torch.manual_seed(0)
    model = TAEHV("taecvx")
    torch.save(model.state_dict(), run / "final" / "taehv.pth")
    write_model_info(model, run / "final", step=1)
    return root, videos, run


def run_inference(*args):
    return subprocess.run([sys.executable, "inference.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_report_fields_psnr_and_skips(setup, tmp_path):
    root, videos, run = setup
    result = run_inference("--model", str(run), "--videos", str(videos), "--frames", "9", "--height", "32",
                           "--width", "48", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["model"]["variant"] == "taecvx"  # from model_info.json beside the weights
    ok = [c for c in report["clips"] if c["status"] == "ok"]
    skipped = [c for c in report["clips"] if c["status"] == "skipped"]
    assert len(ok) == 3 and skipped == [{"path": str(videos / "broken.mp4"), "status": "skipped", "reason": "open_error"}]
    # PSNR equals an independent computation on the same decoded tensors
    model = TAEHV.from_pretrained(run / "final" / "taehv.pth").eval()
    frames, _ = read_clip(videos / "sample_0000.mp4", -1, 9, 1, 1, random.Random(0), False, cover=(32, 48))
    video = resize_and_crop(torch.from_numpy(frames).permute(0, 3, 1, 2), 32, 48, None)[None].float() / 255
    with torch.no_grad():
        decoded = model.decode_video(model.encode_video(video))
    expected = (10 * torch.log10(1 / ((decoded - video[:, : decoded.shape[1]]) ** 2).mean())).item()
    first = next(c for c in ok if c["path"].endswith("sample_0000.mp4"))
    assert first["psnr"] == pytest.approx(expected, abs=1e-3) and first["frames"] == 9 == len(first["per_frame_psnr"])
    assert report["mean"]["psnr"] == pytest.approx(sum(c["psnr"] for c in ok) / 3)


def test_streaming_agrees_and_model_path_kinds(setup, tmp_path):
    root, videos, run = setup
    common = ["--videos", str(videos / "sample_0001.mp4"), "--frames", "9", "--height", "32", "--width", "48"]
    results = {}
    for name, model in (("run", run), ("final", run / "final"), ("file", run / "final" / "taehv.pth")):
        extra = ["--streaming"] if name == "file" else []
        out = tmp_path / name
        completed = run_inference("--model", str(model), *common, *extra, "--out", str(out))
        assert completed.returncode == 0, completed.stderr
        results[name] = json.loads((out / "report.json").read_text())["mean"]["psnr"]
    assert results["run"] == results["final"] and results["file"] == pytest.approx(results["run"], abs=1e-3)
    missing = run_inference("--model", str(tmp_path), *common, "--out", str(tmp_path / "x"))
    assert missing.returncode == 2 and "no taehv.safetensors or taehv.pth" in missing.stderr
    nothing = run_inference("--model", str(run), "--videos", str(videos / "broken.mp4"), "--out", str(tmp_path / "y"))
    assert nothing.returncode == 1
