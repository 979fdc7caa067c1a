"""`make gpu-check` (`make gpu-check BUDGET=480`): what one CUDA GPU lent for minutes can show, the
most valuable first, under one deadline.

    python -m scripts.gpu_check [--budget SECONDS (480)] [--out gpu_check]

The phases, in order of value; each estimate is the time it took in `make gpu-check` on a fresh
H100 (torch 2.11, 2026-11-26, docs/benchmarks.md), rounded up. Phases 1-6 fit 480 s (about 350);
the compile parity took more than 230 s there, so it runs under a budget of 660 or more:
 1. launch: the 1gpu_h100 profile through the launcher at its full shape (4 x 17 x 480x720) for 4
    optimizer steps with every loss term on, its peak memory against the plan
    (scripts/gpu_check_launch.py; offline: random weights where none are on this machine);
 *. notebook: the published notebook's step against ours at its recipe, alternating
    (scripts/benchmark_notebook.py; skipped, and named, without checkouts of its upstream files);
 2. the h100 profile's micro-step benchmark with latents cached, 3. with the reference VAE on the fly;
    both with --kernels: each part's time beside its floor and the top kernels, <out>/benchmark_*.md;
 4. `pytest -m gpu` but the compile parity (phase 7), the profile benchmark (phases 2-3) and the
    memory estimate against the peak, which phase 1 checks at the profile's full shape;
 5. the reference VAE's encode in both memory layouts; 6. TAEHV's inference speed;
 7. the compile parity (`pytest -m gpu -k fast_path_keys`): the slowest.

A phase whose estimate exceeds the time left is skipped, named as skipped for time, and the next
that fits runs; a phase still running at the deadline is stopped with its process group (a
launch's ranks too). The report, <out>/gpu_check.json and gpu_check.md, is rewritten whole
(renamed into place) before and after every phase, so a check stopped from outside keeps what
ran; each phase's output is in <out>/<phase>.log. Exit 1 when a phase failed or was stopped, else
0 (phases skipped for time are named on the last line); without CUDA one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET_S = 480
STOP_GRACE_S = 5  # a stopped phase's processes get SIGTERM, then SIGKILL after this
STARTUP_LIMIT_S = 600  # a profile benchmark alone (tests/test_gpu.py): a cold box's start, then per micro-step
MICRO_STEP_LIMIT_S = 10


@dataclass(frozen=True)
class Phase:
    key: str  # its log file <out>/<key>.log, and its result file <out>/<key>.json when it writes one
    title: str
    estimate_s: float  # measured on an H100: skipped when less time than this is left
    command: list[str]
    writes_json: bool = False
    row: Callable[[dict], str] | None = None  # the report's result cell, from the phase's JSON
    missing: Callable[[], str] | None = None  # why it cannot run on this machine ('' when it can): skipped, named


def benchmark_limit_s(steps: int) -> int:
    """The time limit of `scripts.benchmark --profile h100 --steps N` run alone (tests/test_gpu.py): it
    times N + 3 windows of gradient_accumulation_steps micro-steps after its start."""
    from training.config.load import load_config

    window = load_config("h100", [], 8, check_paths=False).gradient_accumulation_steps
    return STARTUP_LIMIT_S + (steps + 3) * window * MICRO_STEP_LIMIT_S


def benchmark_row(result: dict) -> str:
    mfu = result.get("mfu_vs_spec_peak")
    row = (f"{result['clips_per_s_per_gpu']:.2f} clips/s per GPU (step {result['step_s'] * 1000:.0f} ms, MFU "
           f"{'n/a' if mfu is None else f'{mfu:.1%}'} vs {result['spec_peak']}, {result['mfu_vs_measured_peak']:.1%} vs "
           f"the measured peak, {result['measured_peak_kernel']})")
    if result.get("parts_s"):  # --kernels: the whole table is in the phase's .md
        part, seconds = max(result["parts_s"].items(), key=lambda item: item[1])
        row += f"; most time: {part} {seconds * 1000:.0f} ms, top kernel {result['top_kernels'][0]['name'][:60]}"
    return row


def notebook_row(result: dict) -> str:
    seconds = result["seconds_per_step"]
    return (f"notebook {seconds['notebook'] * 1000:.0f} ms, ours {seconds['ours'] * 1000:.0f} ms per step at its recipe: "
            f"ours {result['ours_over_notebook']:.2f}x the notebook's")


def upstream_missing() -> str:
    """The notebook phase needs checkouts of madebyollin/taehv and madebyollin/seraena (no download here)."""
    from scripts.notebook_recipe import upstream_files

    missing = [str(path) for path in upstream_files() if not path.is_file()]
    return (f"no {', '.join(missing)}: copy checkouts of madebyollin/taehv and madebyollin/seraena there, or set "
            "TAEHV_UPSTREAM_DIR / SERAENA_UPSTREAM_DIR") if missing else ""


def model_row(result: dict) -> str:
    return f"decode {result['decode_s']:.3f} s, encode {result['encode_s']:.3f} s, peak {result['peak_memory_mb']:.0f} MB"


def teacher_row(result: dict) -> str:
    return (f"{result['family']} encode of {'x'.join(map(str, result['shape']))} {result['dtype']}: default "
            f"{result['encode_s']['default']:.3f} s, channels_last_3d {result['encode_s']['channels_last_3d']:.3f} s "
            f"({result['channels_last_speedup']:.2f}x): use {result['use']}")


def launch_row(result: dict) -> str:
    peak = (f"peak {result['peak_memory_gb']:.1f} GB against the plan's {result['plan_comparable_gb']:.1f} GB "
            f"({result['plan_gpu_gb']:.1f} with the CUDA context): {result['peak_vs_plan'] - 1:+.1%}"
            if "peak_memory_gb" in result else "no peak logged")
    random = ", ".join(line.split(":")[0] for line in result["random_weights"])
    weights = f"; random weights: {random}" if random else ""
    return f"{result['shape']}, {result['steps']} steps: {peak}{weights}{'; ' + result['problem'] if result['problem'] else ''}"


def phases(out: Path, python: str = sys.executable) -> list[Phase]:
    pytest = [python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py", "-k"]
    # 2026-11-26 on an H100 (docs/benchmarks.md): launch 130 s, the benchmarks 46 and 58 s, teacher 29,
    # model 6; pytest_gpu 132 with the memory test (61 s), which the launch's peak against the plan repeats

    def benchmark(latents: str) -> list[str]:
        return [python, "-m", "scripts.benchmark", "--profile", "h100", "--steps", "3", "--latents", latents, "--kernels",
                "--json", str(out / f"benchmark_{latents.replace('-', '_')}.json")]

    return [
        Phase("launch", "1gpu_h100 through the launcher, every loss term, peak memory against the plan", 135,
              [python, "-m", "scripts.gpu_check_launch", "--out", str(out / "launch_inputs"), "--json", str(out / "launch.json")],
              True, launch_row),
        # the published notebook's step against ours at its recipe, alternating (not measured on a GPU yet: an estimate)
        Phase("notebook", "the notebook's step and ours at its recipe (scripts/benchmark_notebook.py)", 90,
              [python, "-m", "scripts.benchmark_notebook", "--rounds", "10", "--json", str(out / "notebook.json")], True,
              notebook_row, upstream_missing),
        Phase("benchmark_cached", "h100 micro-step, latents cached", 50, benchmark("cached"), True, benchmark_row),
        Phase("benchmark_on_the_fly", "h100 micro-step, reference VAE on the fly", 62, benchmark("on-the-fly"), True,
              benchmark_row),
        Phase("pytest_gpu", "pytest -m gpu (the rest of tests/test_gpu.py)", 75,
              [*pytest, "not fast_path_keys and not benchmark_of_the_h100_profile and not memory_estimate"]),
        Phase("benchmark_teacher", "reference VAE encode, h100 batch, both layouts", 32,
              [python, "-m", "scripts.benchmark_teacher", "--profile", "h100", "--warmup", "1", "--repeats", "3",
               "--json", str(out / "benchmark_teacher.json")], True, teacher_row),
        Phase("benchmark_model", "TAEHV inference, 1 x 61 x 512x320 fp16", 7,
              [python, "-m", "scripts.benchmark_model", "--variant", "taehv", "--height", "320", "--width", "512", "--frames",
               "61", "--dtype", "fp16", "--json", str(out / "benchmark_model.json")], True, model_row),
        # 112 s at cedab1d (2026-11-25); on 2026-11-26 two of its three tests passed within 230 s
        Phase("compile_parity", "CUDA parity of channels_last and inductor compile (pytest -k fast_path_keys)", 240,
              [*pytest, "fast_path_keys"]),
    ]


def stop(process: subprocess.Popen) -> None:
    """End the phase and every process it started (its own session): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def run_phase(phase: Phase, out: Path, limit_s: float) -> tuple[int | None, float]:
    """(exit status, or None when stopped at the limit; seconds). Its output goes to <out>/<key>.log;
    whatever it leaves running (data workers, ranks) ends with it."""
    start = time.monotonic()
    with (out / f"{phase.key}.log").open("w") as log:
        # a SIGTERM before `process` exists would leave the phase running: held until the try below
        # (the phase itself starts with it unblocked)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            process = subprocess.Popen(phase.command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                       preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}))
        except BaseException:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            raise
        code = None
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            code = process.wait(timeout=max(limit_s, 0.01))
        except subprocess.TimeoutExpired:
            pass
        finally:  # the deadline, or this check stopped from outside (SIGTERM, Ctrl-C)
            stop(process)
    return code, time.monotonic() - start


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.is_file() else []
    return lines[-1].strip()[:300] if lines else "no output"


def write_whole(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)  # a reader, or a check killed now, sees the old report or the new one


def write_report(report: dict, out: Path) -> None:
    write_whole(out / "gpu_check.json", json.dumps(report, indent=2) + "\n")
    write_whole(out / "gpu_check.md", markdown(report))


def run_phases(phase_list: list[Phase], out: Path, deadline: float, report: dict,
               clock: Callable[[], float] = time.monotonic) -> dict:
    """Each phase in order under one deadline (a `clock` time); the report written before and after each."""
    entries = report["phases"] = [{"phase": p.key, "title": p.title, "estimate_s": p.estimate_s, "status": "pending"}
                                  for p in phase_list]
    report["skipped_for_time"] = []
    write_report(report, out)
    for phase, entry in zip(phase_list, entries):
        reason = phase.missing() if phase.missing is not None else ""
        if reason:
            entry.update(status="skipped", note=reason)
            write_report(report, out)
            continue
        left = deadline - clock()
        if left < phase.estimate_s:
            entry.update(status="skipped for time", note=f"{max(left, 0):.0f} s left")
            report["skipped_for_time"].append(phase.key)
            write_report(report, out)
            continue
        result = out / f"{phase.key}.json"
        result.unlink(missing_ok=True)  # an earlier check's result is not this one's
        entry["status"] = "running"
        write_report(report, out)
        try:
            code, seconds = run_phase(phase, out, left)
        except BaseException:
            entry["status"] = "stopped from outside"
            write_report(report, out)
            raise
        entry.update(seconds=round(seconds, 1), exit=code, log=str(out / f"{phase.key}.log"),
                     status="passed" if code == 0 else "stopped at the deadline" if code is None else "failed")
        if phase.writes_json and result.is_file():
            entry["result"] = json.loads(result.read_text())
        if code != 0:
            entry["last_line"] = last_line(out / f"{phase.key}.log")
        write_report(report, out)
    return report


def result_cell(entry: dict, row: Callable[[dict], str] | None) -> str:
    if "result" in entry and row is not None:
        try:
            return row(entry["result"]).replace("|", "/")
        except (KeyError, TypeError, ValueError) as error:
            return f"its JSON lacks {error}"
    if entry["status"] == "skipped for time":
        return f"{entry['note']} of the {entry['estimate_s']:.0f} s it takes"
    if entry["status"] == "skipped":
        return entry["note"].replace("|", "/")
    return entry.get("last_line", "").replace("|", "/")


def launch_weights(report: dict) -> str:
    reported = [entry["result"]["random_weights"] for entry in report["phases"] if "random_weights" in entry.get("result", {})]
    if not reported:
        return "the launch has not reported its weights"
    random = [line for lines in reported for line in lines]
    return f"random weights in the launch: {'; '.join(random)}" if random else "the launch used the weights on this machine"


def markdown(report: dict) -> str:
    rows = {phase.key: phase.row for phase in phases(Path("."))}
    lines = [f"GPU check on {report['device']} (torch {report['torch']}), `python -m scripts.gpu_check --budget "
             f"{report['budget_s']:g}`, {report['date']}", "",
             f"Weights: nothing downloaded; {launch_weights(report)}; the benchmarks use each network's published "
             "architecture with random weights: speed and memory, not quality.", "",
             "| phase | status | seconds (estimate) | result |", "|---|---|---|---|"]
    for entry in report["phases"]:
        seconds = f"{entry['seconds']:.0f}" if "seconds" in entry else "-"
        lines.append(f"| {entry['title']} | {entry['status']} | {seconds} ({entry['estimate_s']:.0f}) | "
                     f"{result_cell(entry, rows.get(entry['phase']))} |")
    if report["skipped_for_time"]:
        lines += ["", f"Skipped for time: {', '.join(report['skipped_for_time'])} (a larger --budget runs them)."]
    return "\n".join(lines) + "\n"


def problems(report: dict) -> list[str]:
    """One line per phase that failed or was stopped, naming it and its output."""
    return [f"{entry['phase']}: {entry['status']}: {entry.get('last_line', '')} (output: {entry['log']})"
            for entry in report["phases"] if entry["status"] in ("failed", "stopped at the deadline")]


def stop_on_sigterm() -> None:
    """SIGTERM (a scheduler taking the machine back, `timeout`) stops the check as Ctrl-C does: the
    running phase ends with its processes and the report says it was stopped from outside."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_check"))
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for every phase together")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        print(f"gpu-check: needs a CUDA GPU, and torch {torch.__version__} ({build}) sees none; run it on a GPU machine "
              "(pytest -m gpu skips these tests here)", file=sys.stderr)
        return 2
    if args.budget <= 0:
        print(f"gpu-check: --budget {args.budget:g} must be a positive number of seconds (default {DEFAULT_BUDGET_S})",
              file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "budget_s": args.budget}
    stop_on_sigterm()
    run_phases(phases(out), out, deadline, report)
    print(markdown(report))
    print(f"written: {out / 'gpu_check.json'}, {out / 'gpu_check.md'}")
    failed = problems(report)
    for line in failed:
        print(f"gpu-check failed: {line}", file=sys.stderr)
    if report["skipped_for_time"]:
        print(f"gpu-check: skipped for time: {', '.join(report['skipped_for_time'])} (--budget {args.budget:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
