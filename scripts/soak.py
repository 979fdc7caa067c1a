"""Fault-injection soak: train the `test` profile on 2 CPU processes through the real launcher,
kill it again and again the way clusters do, restart with --resume auto, and check the outcome.

    python -m scripts.soak --minutes 10 --json soak.json      # the documented run (docs/reliability.md)
    python -m scripts.soak --faults 4 --json soak.json        # the CI form (tests/test_soak.py): one of each kind

Faults, in a seeded random order after one of each kind in the order below:
- checkpoint_write: SIGKILL the whole process tree while a checkpoint is being written, when its
  temporary folder exists, has its first file, or half its files (as a lost node does);
- sigkill_rank: SIGKILL one training process (a crashed rank); torchrun tears down the rest;
- sigterm: SIGTERM to the launcher (preemption); the run checkpoints and exits 143;
- sigkill_agent: SIGKILL torchrun's agent; its ranks must die with it, not train on as orphans.
Every run, the uninterrupted one included, has Seraena on and a NaN loss at micro-steps 2 and 11
(skipped batches), so an exact resume must restore each rank's replay buffer and random state and
count the data position in batches.
A cycle is one run folder trained to max_steps through faults; cycles repeat until --minutes
have passed (or --faults were injected), and the last one always finishes. Every cycle is
checked against one uninterrupted run of the same config:
- half_written_checkpoints_selected: a resume picked a checkpoint whose files are not the full set;
- steps_lost: a restart resumed from before the newest complete checkpoint at the time of the fault;
- loss_mismatches: a step logged a loss other than the uninterrupted run's at that step;
- final_weights_equal: the exported weights equal the uninterrupted run's, bit for bit;
- max_recovery_s: longest time from a fault to the next training step logged by the restart;
- orphaned_processes: training processes still alive 60 s after their launcher ended.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from scripts.benchmark import free_port  # noqa: E402
from scripts.results import emit_result  # noqa: E402
from models.variants import export_in  # noqa: E402

STEP_LINE = re.compile(r"Step (\d+)/\d+ \| Loss: ([\d.]+)")
RESUMED_LINE = re.compile(r"resumed from (\S+) at step (\d+)")
KINDS = ("checkpoint_write", "sigkill_agent", "sigterm", "sigkill_rank")
WRITE_MOMENTS = ("created", "first file", "half")
NONFINITE_MICRO_STEPS = "2,11"


def start_run(run_dir: Path, clips: Path, max_steps: int, resume: bool, output: Path) -> subprocess.Popen:
    # every run, the uninterrupted one too, skips the same two batches (NaN loss): a resume must find
    # the data position by batches, not steps
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port()),
           "TAEHV_FAULT_NONFINITE_MICRO_STEPS": NONFINITE_MICRO_STEPS}
    command = [str(REPO_ROOT / "train_taehv_h100.sh"), "2", "test", "--output-dir", str(run_dir), "--max-steps", str(max_steps)]
    command += ["--resume", "auto"] if resume else []
    # Seraena on: each rank's replay buffer and random state must come back with the checkpoint
    for item in (f"data_root={clips}", "checkpointing_steps=3", "checkpoints_total_limit=2", f"validation_steps={max_steps}",
                 "log_every=1", "seraena_weight=0.1", "batch_size_per_gpu=2"):
        command += ["--set", item]
    with open(output, "w") as log:  # the launcher's own output, kept for diagnosis
        return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def tree(pid: int) -> list:
    import psutil

    try:
        parent = psutil.Process(pid)
        return [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun's workers sit in their own group)."""
    import psutil

    for process in tree(pid):
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


def processes_of(pid: int, role: str) -> list:
    """'rank': the training processes; 'agent': torchrun's agent (accelerate launch), whose
    command line also names taehv_train.py."""
    found = []
    for process in tree(pid):
        try:
            command = " ".join(process.cmdline())
        except Exception:  # exited while being listed
            continue
        is_agent = "training.base.launch" in command  # the launchers run accelerate launch through training/base/launch.py
        if "taehv_train.py" in command and is_agent == (role == "agent"):
            found.append(process)
    return found


def leftovers(run_dir: Path) -> list:
    """Processes of any earlier attempt still working on this run folder."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if "taehv_train.py" in " ".join(process.cmdline()) and str(run_dir) in process.cmdline():
                found.append(process)
        except Exception:
            pass
    return found


def files_of(folder: Path) -> list[str]:
    try:
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.stat().st_size > 0)
    except FileNotFoundError:
        return []


def complete_steps(run_dir: Path, expected_files: list[str]) -> list[int]:
    """Steps of the checkpoint folders holding the full set of files (judged independently of the trainer)."""
    folder = run_dir / "checkpoints"
    found = folder.glob("checkpoint-*") if folder.is_dir() else []
    return sorted(int(p.name.split("-")[1]) for p in found if files_of(p) == expected_files)


def log_text(run_dir: Path) -> str:
    path = run_dir / "train.log"
    return path.read_text() if path.is_file() else ""


def wait_for(condition, timeout: float, poll: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return False


def inject(process, run_dir: Path, kind: str, rng: random.Random, expected_files: list[str], log_offset: int) -> dict | None:
    """Waits until the run trains, then injects `kind`; None when the run ended first."""
    def training() -> bool:
        return STEP_LINE.search(log_text(run_dir)[log_offset:]) is not None or process.poll() is not None

    wait_for(training, 300, poll=0.05)
    if process.poll() is not None:
        return None
    fault = {"kind": kind}
    if kind == "checkpoint_write":
        moment = rng.choice(WRITE_MOMENTS)
        fault["moment"] = moment
        needed = {"created": 0, "first file": 1, "half": len(expected_files) // 2}[moment]

        def writing() -> bool:
            for temporary in (run_dir / "checkpoints").glob(".tmp-checkpoint-*"):
                if needed <= len(files_of(temporary)) < len(expected_files):
                    return True
            return process.poll() is not None

        if not wait_for(writing, 120, poll=0.002) or process.poll() is not None:
            return None
        kill_tree(process.pid)
    else:
        time.sleep(rng.uniform(0.2, 3.0))
        if process.poll() is not None:
            return None
        if kind == "sigterm":
            os.kill(process.pid, signal.SIGTERM)
        else:
            targets = processes_of(process.pid, "agent" if kind == "sigkill_agent" else "rank")
            if not targets:
                return None
            rng.choice(targets).send_signal(signal.SIGKILL)
    fault["at"] = time.monotonic()
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:  # a rank stuck in a collective: what a job scheduler would do next
        kill_tree(process.pid)
        process.wait()
    fault["exit_code"] = process.returncode
    # nothing of this attempt may go on working in the run folder (a restart would race with it)
    if not wait_for(lambda: not leftovers(run_dir), 60, poll=0.2):
        fault["orphans"] = len(leftovers(run_dir))
        for orphan in leftovers(run_dir):
            orphan.kill()
    fault["newest_complete_checkpoint"] = max(complete_steps(run_dir, expected_files), default=0)
    return fault


def reference_run(work: Path, clips: Path, max_steps: int) -> dict:
    run_dir = work / "uninterrupted"
    process = start_run(run_dir, clips, max_steps, resume=False, output=work / "uninterrupted.out")
    if process.wait(timeout=900) != 0:
        raise RuntimeError(f"the uninterrupted run failed: see {run_dir / 'train.log'}\n{tail(work / 'uninterrupted.out')}")
    checkpoint = max((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return {"dir": run_dir, "losses": dict(STEP_LINE.findall(log_text(run_dir))), "expected_files": files_of(checkpoint)}


def tail(path: Path, lines: int = 40) -> str:
    """The end of a launcher's output, for an error message that explains itself."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def weights_equal(a: Path, b: Path) -> bool:
    import torch

    from models.taehv import load_state_dict_file

    first, second = load_state_dict_file(a), load_state_dict_file(b)
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def run_cycle(work: Path, number: int, clips: Path, max_steps: int, reference: dict, rng: random.Random,
              kinds: list[str], injecting, report: dict) -> None:
    run_dir = work / f"cycle-{number}"
    pending_fault = None
    for attempt in range(200):
        log_offset = len(log_text(run_dir))
        process = start_run(run_dir, clips, max_steps, resume=attempt > 0, output=work / f"cycle-{number}-attempt-{attempt}.out")
        if pending_fault is not None:  # measure recovery and check what the restart resumed from
            wait_for(lambda: STEP_LINE.search(log_text(run_dir)[log_offset:]) or process.poll() is not None, 300, 0.05)
            report["max_recovery_s"] = max(report["max_recovery_s"], round(time.monotonic() - pending_fault["at"], 1))
            resumed = RESUMED_LINE.search(log_text(run_dir)[log_offset:])
            step = int(resumed.group(2)) if resumed else 0
            if resumed and files_of(Path(resumed.group(1))) != reference["expected_files"]:
                report["half_written_checkpoints_selected"] += 1
            report["steps_lost"] += max(0, pending_fault["newest_complete_checkpoint"] - step)
            pending_fault["resumed_at_step"] = step
            trained_on = STEP_LINE.search(log_text(run_dir)[log_offset:]) or process.poll() == 0  # or finished at once
            report["faults_survived"] += int(bool(trained_on))
            pending_fault = None
        fault = None
        if injecting():
            kind = kinds[0] if kinds else rng.choice(KINDS)
            fault = inject(process, run_dir, kind, rng, reference["expected_files"], log_offset)
            if fault is not None and kinds:  # a kind whose run ended first is tried again on the next run
                kinds.pop(0)
        if fault is None:
            if process.wait(timeout=900) == 0 and export_in(run_dir / "final") is not None:
                break
            output = work / f"cycle-{number}-attempt-{attempt}.out"
            raise RuntimeError(f"cycle {number}: the run failed without an injected fault: see {run_dir / 'train.log'} "
                               f"and {output}\n{tail(output)}")
        report["faults_injected"] += 1
        report["orphaned_processes"] += fault.get("orphans", 0)
        print(f"cycle {number} attempt {attempt}: {fault['kind']} {fault.get('moment', '')} -> exit {fault['exit_code']}, "
              f"newest complete checkpoint {fault['newest_complete_checkpoint']}", flush=True)
        report["faults"].append({"cycle": number, **{k: v for k, v in fault.items() if k != "at"}})
        pending_fault = fault
    logged = STEP_LINE.findall(log_text(run_dir))
    report["loss_mismatches"] += sum(reference["losses"].get(step) != loss for step, loss in logged)
    report["steps_never_logged"] += len(set(reference["losses"]) - {step for step, _ in logged})
    report["final_weights_equal"].append(weights_equal(export_in(run_dir / "final"), export_in(reference["dir"] / "final")))


def soak(minutes: float, seed: int, max_steps: int, work: Path, max_faults: int | None = None) -> dict:
    from training.data.synthetic_clips import make_sample_videos

    started = time.monotonic()
    clips = work / "clips"
    make_sample_videos(clips, count=8, n_frames=16)
    reference = reference_run(work, clips, max_steps)
    report = {"minutes": minutes, "seed": seed, "max_steps": max_steps, "processes": 2, "profile": "test",
              "faults_injected": 0, "faults_survived": 0, "steps_lost": 0, "half_written_checkpoints_selected": 0,
              "max_recovery_s": 0.0, "orphaned_processes": 0, "loss_mismatches": 0, "steps_never_logged": 0, "final_weights_equal": [],
              "cycles": 0, "faults": []}
    rng = random.Random(seed)
    kinds = list(KINDS)
    deadline = time.monotonic() + minutes * 60  # faults are injected for `minutes` after the uninterrupted run

    def injecting() -> bool:
        return time.monotonic() < deadline and (max_faults is None or report["faults_injected"] < max_faults)

    while injecting() or report["cycles"] == 0:
        run_cycle(work, report["cycles"], clips, max_steps, reference, rng, kinds, injecting, report)
        report["cycles"] += 1
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["ok"] = (report["faults_survived"] == report["faults_injected"] and report["steps_lost"] == 0
                    and report["half_written_checkpoints_selected"] == 0 and report["loss_mismatches"] == 0
                    and report["steps_never_logged"] == 0 and report["orphaned_processes"] == 0
                    and all(report["final_weights_equal"]))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="time during which faults are injected")
    parser.add_argument("--faults", type=int, help="stop injecting after this many faults (the first four: one of each kind)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=40, help="steps of each cycle's run")
    parser.add_argument("--work-dir", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.work_dir:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        report = soak(args.minutes, args.seed, args.max_steps, args.work_dir, args.faults)
    else:
        with tempfile.TemporaryDirectory() as work:
            report = soak(args.minutes, args.seed, args.max_steps, Path(work), args.faults)
    emit_result(report, args.json)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
