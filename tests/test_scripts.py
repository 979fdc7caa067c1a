import json
import subprocess
import sys

from conftest import REPO_ROOT


def test_benchmark_model_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run(
        [sys.executable, "-m", "scripts.benchmark_model", "--height", "32", "--width", "48", "--frames", "5",
         "--repeats", "1", "--warmup", "0", "--mode", "sequential", "--json", str(out)],
        cwd=REPO_ROOT, check=True, capture_output=True,
    )
    result = json.loads(out.read_text())
    assert result["latents"] == [1, 2, 16, 4, 6] and result["decoded"] == [1, 5, 3, 32, 48]
    assert result["encode_frames_per_s"] > 0 and result["decode_frames_per_s"] > 0
    assert result["peak_memory_kind"] == "cpu_peak_rss_growth"


def test_selfcheck_passes():
    completed = subprocess.run(
        [sys.executable, "-m", "scripts.selfcheck"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "self-check passed" in completed.stdout
