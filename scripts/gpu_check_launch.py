"""The first phase of `make gpu-check`: a GPU profile through the launcher at its full shape for a
few optimizer steps with every loss term on, and its peak GPU memory against the plan. Offline.

    python -m scripts.gpu_check_launch --out DIR --json launch.json [--profile 1gpu_h100] [--steps 4]

Nothing is downloaded. Clips are made on the spot (training/data/synthetic_clips.py). Where the
profile's ref_vae_path is neither a local folder nor in the Hugging Face cache, the family's
published architecture (its diffusers class's default config) is built with random weights and
written with save_pretrained; where the LPIPS files are not found, spec-shaped random ones are
written (models.metrics.save_random_lpips_weights). The JSON names what was random: memory and
speed are those of the real networks, the losses and metrics mean nothing.

The peak is train/peak_memory_gb, torch.cuda.max_memory_allocated over each log interval (no CUDA
context), the largest interval's; the plan is the dry run's GPU figure per rank
(training/plan/memory.py) less its CUDA context. Exit 1 when the peak is more than 15% from it
(the band of tests/test_gpu.py), or the launch's own exit status when it failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# every loss term on (training/config/terms.py LOSS_TERMS): the profiles leave the temporal and chroma terms off
EVERY_TERM = ["temporal_weight=0.1", "chroma_weight=1.0"]
# a short run: 2 micro-steps per optimizer step, a log line (and its peak) per step, from scratch
SHORT_RUN = ["gradient_accumulation_steps=2", "global_batch_size=0", "log_every=1", "pretrained_model_path="]
PLAN_TOLERANCE = 0.15


def reference_on_disk(path: str) -> bool:
    """A local diffusers folder, or a hub id already in the Hugging Face cache: weights to use as they are."""
    from training.config.inputs import hub_model_is_cached
    from training.config.schema import HUB_ID

    folder = Path(path)
    if folder.is_dir():
        return (folder / "config.json").is_file() or (folder / "vae" / "config.json").is_file()
    return bool(HUB_ID.match(path)) and hub_model_is_cached(path)


def build_random_reference(family: str, folder: Path, tiny: bool = False) -> Path:
    """The family's diffusers class with random weights, written with save_pretrained into `folder`
    (renamed into place: a check stopped while writing leaves no half folder to trust next time)."""
    import torch

    from models.reference_vae import reference_architecture, tiny_reference_vae

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    vae = tiny_reference_vae(family) if tiny else reference_architecture(family)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    vae.save_pretrained(str(partial))
    partial.rename(folder)
    return folder


def offline_inputs(config, folder: Path, tiny: bool = False, clips: int = 12) -> tuple[list[str], list[str]]:
    """(--set items, what was made with random weights) so that `config` runs without a download:
    clips, and the reference VAE and the LPIPS files where they are not on this machine."""
    from models.metrics import LPIPSUnavailable, find_lpips_weights, save_random_lpips_weights
    from training.data.synthetic_clips import make_sample_videos

    folder.mkdir(parents=True, exist_ok=True)
    make_sample_videos(folder / "clips", count=clips)  # 40-56 frames each: a clip at any stride of the profile
    sets, random = [f"data_root={folder / 'clips'}", "sample_data="], []
    if config.use_ref_vae and not config.latent_cache and not reference_on_disk(config.ref_vae_path):
        path = build_random_reference(config.reference_family, folder / "reference_vae", tiny)
        sets.append(f"ref_vae_path={path}")
        built = "a tiny test config" if tiny else "its published architecture"
        random.append(f"reference VAE ({config.reference_family}, {built}): ref_vae_path={config.ref_vae_path!r} is not on this machine")
    try:
        find_lpips_weights(config.lpips_backbone_path, config.lpips_weights_path)
    except LPIPSUnavailable:
        backbone, heads = save_random_lpips_weights(folder / "lpips")
        sets += [f"lpips_backbone_path={backbone}", f"lpips_weights_path={heads}"]
        random.append("LPIPS (AlexNet and heads): its files are not on this machine")
    return sets, random


def peak_against_plan(peak_gb: float, plan_gb: float, context_gb: float) -> tuple[float, str]:
    """(peak / comparable plan, the problem or ''): the measured peak holds no CUDA context."""
    comparable = plan_gb - context_gb
    ratio = peak_gb / comparable
    if abs(ratio - 1) <= PLAN_TOLERANCE:
        return ratio, ""
    side = "above" if ratio > 1 else "below"
    return ratio, (f"peak {peak_gb:.1f} GB is {abs(ratio - 1):.0%} {side} the plan's {comparable:.1f} GB "
                   f"(more than {PLAN_TOLERANCE:.0%}): training/plan/memory.py "
                   + ("misses memory this run uses" if side == "above" else "counts memory this run does not use"))


def logged_peaks(run_dir: Path) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "logs" / "taehv"))
    events.Reload()
    if "train/peak_memory_gb" not in events.Tags()["scalars"]:
        return []
    return [event.value for event in events.Scalars("train/peak_memory_gb")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="inputs and the run folder")
    parser.add_argument("--json", type=Path, required=True, help="the result")
    parser.add_argument("--profile", default="1gpu_h100")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps")
    args = parser.parse_args(argv)
    from training.config.load import load_config
    from training.plan.memory import CUDA_CONTEXT_GB, estimate_memory

    sets = [*EVERY_TERM, *SHORT_RUN]
    inputs, random = offline_inputs(load_config(args.profile, sets, num_processes=1, check_paths=False), args.out)
    sets += inputs
    config = load_config(args.profile, sets, num_processes=1, check_paths=False)
    run_dir = args.out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run folder of an earlier check would be resumed
    command = [str(REPO_ROOT / "train_taehv_h100.sh"), "1", args.profile, "--output-dir", str(run_dir),
               "--max-steps", str(args.steps), *[arg for item in sets for arg in ("--set", item)]]
    result = {"profile": args.profile, "steps": args.steps, "command": " ".join(command),
              "shape": f"{config.batch_size_per_gpu} x {config.n_frames} x {config.height}x{config.width}",
              "random_weights": random}
    print(f"gpu-check launch: {result['command']}", flush=True)
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    code = subprocess.call(command, cwd=REPO_ROOT, env=env)
    peaks = logged_peaks(run_dir) if run_dir.is_dir() else []
    plan_gb = estimate_memory(config).gpu_gb  # cached: the launcher measured it before starting
    result.update(exit=code, peak_memory_gb_by_interval=[round(p, 2) for p in peaks], plan_gpu_gb=round(plan_gb, 2),
                  plan_comparable_gb=round(plan_gb - CUDA_CONTEXT_GB, 2))
    problem = f"the launch failed (exit {code}): its output is above" if code else ""
    if peaks:
        ratio, memory_problem = peak_against_plan(max(peaks), plan_gb, CUDA_CONTEXT_GB)
        result.update(peak_memory_gb=round(max(peaks), 2), peak_vs_plan=round(ratio, 3))
        problem = problem or memory_problem
    elif not code:
        problem = f"no train/peak_memory_gb in {run_dir / 'logs'}"
    result["problem"] = problem
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    if problem:
        print(f"gpu-check launch: {problem}", file=sys.stderr)
    return code or (1 if problem else 0)


if __name__ == "__main__":
    sys.exit(main())
