"""The one-command GPU acceptance run (`make gpu-check`), on one CUDA GPU, in about 10 minutes
(pytest may take up to 15 on a cold inductor cache: its compiles are in its budget):

1. `pytest -m gpu` (tests/test_gpu.py: a bf16 DeepSpeed run with a real CUDA out-of-memory error
   skipped by the agreement, fused AdamW / TF32 / cuDNN autotuning, channels_last and inductor
   compile parity, the memory estimate against the measured peak, the profile benchmark);
2. the training micro-step of the h100 profile (scripts/benchmark.py --profile h100), with
   latents cached and with the reference VAE on the fly: clips/s per GPU and MFU;
3. scripts/benchmark_model.py at 512x320x61 in fp16, to compare with the public ~0.5 s decode.

Writes <out>/gpu_check.json and <out>/gpu_check.md (a table in the layout of docs/benchmarks.md).
Without CUDA it stops with one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def run(command: list[str], timeout: int) -> tuple[int, str, float]:
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:  # keep what it printed until then: the reason is usually in it
        printed = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part
                          for part in (error.stdout, error.stderr) if part)
        code, output = 124, f"{printed}\ntimed out after {timeout} s"
    return code, output, time.perf_counter() - start


def markdown(report: dict) -> str:
    lines = [f"GPU check on {report['device']} (torch {report['torch']}), `make gpu-check`, {report['date']}", "",
             "| measurement | value |", "|---|---|", f"| pytest -m gpu | {report['pytest']['summary']} |"]
    for name, bench in report["benchmarks"].items():
        if "error" in bench:
            lines.append(f"| {name} | failed: {bench['error']} |")
            continue
        mfu = bench.get("mfu_vs_spec_peak")
        lines.append(f"| {name}: clips/s per GPU | {bench['clips_per_s_per_gpu']:.2f} (step {bench['step_s'] * 1000:.0f} ms, "
                     f"MFU {'n/a' if mfu is None else f'{mfu:.1%}'} vs {bench['spec_peak']}, "
                     f"{bench['mfu_vs_measured_matmul_peak']:.1%} vs measured matmul peak) |")
    model = report["benchmark_model"]
    if "error" in model:
        lines.append(f"| taehv 512x320x61 fp16 | failed: {model['error']} |")
    else:
        lines.append(f"| taehv 512x320x61 fp16 decode / encode | {model['decode_s']:.3f} s / {model['encode_s']:.3f} s, "
                     f"peak {model['peak_memory_mb']:.0f} MB |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_check"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        print(f"gpu-check: needs a CUDA GPU, and torch {torch.__version__} ({build}) sees none; run it on a GPU machine "
              "(pytest -m gpu skips these tests here)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "benchmarks": {}}
    code, output, seconds = run([python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"], 900)
    summary = output.strip().splitlines()[-1] if output.strip() else "no output"
    report["pytest"] = {"exit": code, "summary": summary, "seconds": round(seconds, 1)}
    (args.out / "pytest_gpu.txt").write_text(output)
    for name, latents in (("h100 profile, latents cached", "cached"), ("h100 profile, reference VAE on the fly", "on-the-fly")):
        path = args.out / f"benchmark_h100_{latents}.json"
        code, output, _ = run([python, "-m", "scripts.benchmark", "--profile", "h100", "--steps", "10", "--latents", latents,
                               "--json", str(path)], 240)
        report["benchmarks"][name] = json.loads(path.read_text()) if code == 0 else {"error": output.strip()[-300:]}
    path = args.out / "benchmark_model_fp16.json"
    code, output, _ = run([python, "-m", "scripts.benchmark_model", "--variant", "taehv", "--height", "320", "--width", "512",
                           "--frames", "61", "--dtype", "fp16", "--json", str(path)], 120)
    report["benchmark_model"] = json.loads(path.read_text()) if code == 0 else {"error": output.strip()[-300:]}
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"written: {args.out / 'gpu_check.json'}, {args.out / 'gpu_check.md'}")
    failed = report["pytest"]["exit"] != 0 or any("error" in b for b in report["benchmarks"].values()) or "error" in report["benchmark_model"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
