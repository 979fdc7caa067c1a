"""The one-command GPU acceptance run (`make gpu-check`), on one CUDA GPU, in about 10 minutes on
a warm box. Each phase has a time limit far above that (a cold box compiles inductor kernels,
autotunes cuDNN for every shape and builds the 215 M-parameter reference VAE): pytest 60 minutes,
each profile benchmark 10 minutes of start-up plus 10 s per timed micro-step, the model benchmark
10 minutes; --time-scale multiplies them. A phase that fails or overruns is named in the report
and in one line at the end.

1. `pytest -m gpu` (tests/test_gpu.py: a bf16 DeepSpeed run with a real CUDA out-of-memory error
   skipped by the agreement, fused AdamW / TF32 / cuDNN autotuning, channels_last and inductor
   compile parity, the memory estimate against the measured peak, the profile benchmark);
2. the training micro-step of the h100 profile (scripts/benchmark.py --profile h100), with
   latents cached and with the reference VAE on the fly: clips/s per GPU and MFU;
3. scripts/benchmark_model.py at 512x320x61 in fp16, to compare with the public ~0.5 s decode;
4. scripts/benchmark_teacher.py: the reference VAE's encode of an h100 batch in the default layout
   and in channels_last_3d, and which `ref_vae_channels_last` the runs should use.

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


PYTEST_LIMIT_S = 3600  # tests/test_gpu.py: two training launches, three inductor compiles, a profile benchmark
STARTUP_LIMIT_S = 600  # a benchmark's start on a cold box: CUDA context, the reference VAE's build, cuDNN autotuning
MICRO_STEP_LIMIT_S = 10  # per micro-step of the h100 profile with the reference VAE on the fly (~1 s on an H100)
MODEL_BENCHMARK_LIMIT_S = 600


def benchmark_limit_s(steps: int) -> int:
    """The time limit of `scripts.benchmark --profile h100 --steps N`: it times N + 3 windows of
    gradient_accumulation_steps micro-steps (13 x 4 = 52 at 10 steps) after its start."""
    from training.config.load import load_config

    window = load_config("h100", [], 8, check_paths=False).gradient_accumulation_steps
    return STARTUP_LIMIT_S + (steps + 3) * window * MICRO_STEP_LIMIT_S


def run(command: list[str], timeout: int, phase: str) -> tuple[int, str, float]:
    """(exit status, output, seconds); a phase past its limit is stopped with status 124 and its
    output ends with a line naming the phase and the limit."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:  # keep what it printed until then: the reason is usually in it
        printed = "".join(part.decode(errors="replace") if isinstance(part, bytes) else part
                          for part in (error.stdout, error.stderr) if part)
        code, output = 124, f"{printed}\n{phase} overran its {timeout} s time limit (--time-scale raises it)"
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
                     f"{bench['mfu_vs_measured_peak']:.1%} vs measured peak, {bench['measured_peak_kernel']}) |")
    model = report["benchmark_model"]
    if "error" in model:
        lines.append(f"| taehv 512x320x61 fp16 | failed: {model['error']} |")
    else:
        lines.append(f"| taehv 512x320x61 fp16 decode / encode | {model['decode_s']:.3f} s / {model['encode_s']:.3f} s, "
                     f"peak {model['peak_memory_mb']:.0f} MB |")
    teacher = report.get("benchmark_teacher", {})
    if "error" in teacher:
        lines.append(f"| reference VAE encode, h100 batch | failed: {teacher['error']} |")
    elif teacher:
        lines.append(f"| {teacher['family']} encode of {'x'.join(map(str, teacher['shape']))} {teacher['dtype']}: default / "
                     f"channels_last_3d | {teacher['encode_s']['default']:.3f} s / {teacher['encode_s']['channels_last_3d']:.3f} s "
                     f"({teacher['channels_last_speedup']:.2f}x): use {teacher['use']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_check"))
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every phase's time limit (a slow or cold box)")
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

    def limit(seconds: float) -> int:
        return int(seconds * args.time_scale)

    code, output, seconds = run([python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"],
                                limit(PYTEST_LIMIT_S), "pytest -m gpu")
    summary = output.strip().splitlines()[-1] if output.strip() else "no output"
    report["pytest"] = {"exit": code, "summary": summary, "seconds": round(seconds, 1)}
    (args.out / "pytest_gpu.txt").write_text(output)
    for name, latents in (("h100 profile, latents cached", "cached"), ("h100 profile, reference VAE on the fly", "on-the-fly")):
        path = args.out / f"benchmark_h100_{latents}.json"
        code, output, _ = run([python, "-m", "scripts.benchmark", "--profile", "h100", "--steps", "10", "--latents", latents,
                               "--json", str(path)], limit(benchmark_limit_s(10)), f"benchmark ({name})")
        report["benchmarks"][name] = json.loads(path.read_text()) if code == 0 else {"error": output.strip()[-300:]}
    path = args.out / "benchmark_model_fp16.json"
    code, output, _ = run([python, "-m", "scripts.benchmark_model", "--variant", "taehv", "--height", "320", "--width", "512",
                           "--frames", "61", "--dtype", "fp16", "--json", str(path)], limit(MODEL_BENCHMARK_LIMIT_S),
                          "benchmark_model (taehv 512x320x61 fp16)")
    report["benchmark_model"] = json.loads(path.read_text()) if code == 0 else {"error": output.strip()[-300:]}
    path = args.out / "benchmark_teacher_h100.json"
    code, output, _ = run([python, "-m", "scripts.benchmark_teacher", "--profile", "h100", "--json", str(path)],
                          limit(MODEL_BENCHMARK_LIMIT_S), "benchmark_teacher (reference VAE encode, h100 shape)")
    report["benchmark_teacher"] = json.loads(path.read_text()) if code == 0 else {"error": output.strip()[-300:]}
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "gpu_check.md").write_text(markdown(report))
    print(markdown(report))
    print(f"written: {args.out / 'gpu_check.json'}, {args.out / 'gpu_check.md'}")
    problems = failures(report, args.out)
    for problem in problems:
        print(f"gpu-check failed: {problem}", file=sys.stderr)
    return 1 if problems else 0


def failures(report: dict, out: Path) -> list[str]:
    """One line per phase that failed or overran its limit, naming it and where its output is."""
    problems = []
    if report["pytest"]["exit"] != 0:
        problems.append(f"pytest -m gpu: {report['pytest']['summary']} (output: {out / 'pytest_gpu.txt'})")
    for name, bench in [*report["benchmarks"].items(), ("benchmark_model (taehv 512x320x61 fp16)", report["benchmark_model"]),
                        ("benchmark_teacher (reference VAE encode, h100 shape)", report.get("benchmark_teacher", {}))]:
        if "error" in bench:
            problems.append(f"{name}: {bench['error'].strip().splitlines()[-1] if bench['error'].strip() else 'no output'}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
