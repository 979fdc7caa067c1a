"""The lowest versions requirements.txt allows, installed and trained: requirements.txt calls its lower
bounds the versions this project was tested against, and `make lowest-deps` is that test.

  uv pip install --resolution lowest-direct -r requirements.txt   (the Makefile's lowest-deps target)
  python -m scripts.lowest_deps check         in the environment built so: the installed versions are
                                              the bounds, every module the project imports imports, and
                                              the test profile trains with every loss term on

The check's parts, each failure one line:
- versions: each requirement installed at exactly its lower bound (else the check tests something else);
- imports: each package's modules, with what fails only at import named (an OpenCV wheel built for
  numpy 1 installs beside numpy 2 and fails there; validation would then leave the warping error
  out with one log line, and matplotlib's plots would fail in scripts/evaluation_report.py);
- training: the test profile through the launcher, (1) distilling from a tiny CogVideoX VAE (diffusers'
  class, random weights) with every term on (encoder, decoder, reconstruction, chroma, perceptual with
  random LPIPS weights, temporal, Seraena with the adaptive weight) under DeepSpeed ZeRO-2, and (2) in
  autoencoder mode with mixed scales (half_size_every), validation_sizes and every term it allows, in one
  process; each must exit 0 with its export written.

Needs internet once (pip), a C++ compiler for DeepSpeed's CPU op, and 2-3 CPU-minutes for the op
and the runs. On Linux, PyPI's build of an old torch is a CUDA one (about 3 GB with its libraries);
it runs on the CPU.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements.txt"

# what the project imports of each requirement (the distribution's name -> its modules)
MODULES = {
    "torch": ["torch", "torch.distributed"],
    "accelerate": ["accelerate"],
    "deepspeed": ["deepspeed"],
    "diffusers": ["diffusers"],
    "transformers": ["transformers"],
    "safetensors": ["safetensors.torch"],
    "av": ["av"],
    "numpy": ["numpy"],
    "pyyaml": ["yaml"],
    "easydict": ["easydict"],
    "tensorboard": ["tensorboard.backend.event_processing.event_accumulator"],
    "tqdm": ["tqdm"],
    "boto3": ["boto3"],
    "matplotlib": ["matplotlib.pyplot"],
    "opencv-python-headless": ["cv2"],
    "pillow": ["PIL.Image"],
    "pytest": ["pytest"],
    "pytest-xdist": ["xdist"],
    "import-linter": ["importlinter"],
}


def lower_bounds(path: Path = REQUIREMENTS) -> dict[str, str]:
    """{distribution name (lower case): its lower bound} of each `name>=X` line."""
    bounds = {}
    for line in path.read_text().splitlines():
        found = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", line.split("#", 1)[0])
        if found:
            bounds[found.group(1).lower()] = found.group(2)
    return bounds


def release(version: str) -> tuple[int, ...]:
    """'2.6.0+cu124' -> (2, 6, 0)."""
    return tuple(int(p) for p in re.match(r"[0-9.]+", version).group(0).strip(".").split("."))


def at_bound(installed: str, bound: str) -> bool:
    """The installed release is the bound itself (4.70.0 for 4.70). When the resolver had to take a later
    one (no wheel for this Python, or one that conflicts with another bound), the bound is not what was
    tested: requirements.txt should name the release taken."""
    have, want = release(installed), release(bound)
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) == want + (0,) * (width - len(want))


def check_versions(bounds: dict[str, str]) -> list[str]:
    problems = []
    for name, bound in bounds.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed (requirements.txt asks for >={bound})")
            continue
        if not at_bound(installed, bound):
            problems.append(f"{name}: {installed} installed, not the lower bound {bound}: this is not the lowest environment")
    return problems


def check_imports(bounds: dict[str, str]) -> list[str]:
    problems = []
    for name in bounds:
        for module in MODULES.get(name, [name.replace("-", "_")]):
            try:
                importlib.import_module(module)
            except Exception as error:  # noqa: BLE001 - any failure at import is the finding
                problems.append(f"{name}=={bounds[name]}: import {module} fails: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    if not problems:
        problems += check_uses()
    return problems


def check_uses() -> list[str]:
    """What the project calls in the packages whose failures a mere import does not show."""
    import numpy as np

    problems = []
    try:
        import cv2

        frames = (np.random.default_rng(0).random((2, 32, 32)) * 255).astype(np.uint8)
        cv2.calcOpticalFlowFarneback(frames[0], frames[1], None, 0.5, 3, 15, 3, 5, 1.2, 0)
    except Exception as error:  # noqa: BLE001
        problems.append(f"opencv-python-headless: the warping error's optical flow fails: {type(error).__name__}: {error}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots()
        axes.plot(np.arange(3), np.arange(3))
        figure.savefig(Path(tempfile.mkdtemp()) / "plot.png")
    except Exception as error:  # noqa: BLE001
        problems.append(f"matplotlib: a plot fails: {type(error).__name__}: {error}")
    return problems


def launch(run_dir: Path, sets: list[str]) -> str:
    """One launch of the test profile through the launcher, in this Python; '' when it exits 0 with its export."""
    environment = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    command = [str(ROOT / "train_taehv_h100.sh"), "1", "test", "--output-dir", str(run_dir)]
    command += [arg for item in sets for arg in ("--set", item)]
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0 or not list((run_dir / "final").glob("*.safetensors")):
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        return f"the run in {run_dir} failed (exit code {result.returncode}):\n{tail}"
    return ""


def check_training(folder: Path) -> list[str]:
    from models.metrics import save_random_lpips_weights
    from models.reference_vae import tiny_reference_vae_config, vae_class
    from training.data.synthetic_clips import make_sample_videos

    make_sample_videos(folder / "clips", count=6, n_frames=24)
    backbone, heads = save_random_lpips_weights(folder / "lpips")
    vae_class("cogvideox")(**tiny_reference_vae_config("cogvideox")).save_pretrained(str(folder / "vae" / "vae"))
    common = [f"data_root={folder / 'clips'}", f"lpips_backbone_path={backbone}", f"lpips_weights_path={heads}",
              "perceptual_weight=0.1", "temporal_weight=0.1", "chroma_weight=0.1", "seraena_weight=0.1", "max_steps=3",
              "validation_steps=3", "checkpointing_steps=3"]
    runs = {
        "distilling, every term, DeepSpeed ZeRO-2": common + [
            "accelerate_config=deepspeed_cpu.yaml", "use_ref_vae=true", "ref_vae_family=cogvideox",
            f"ref_vae_path={folder / 'vae'}", "n_frames=9", "encoder_weight=0.1", "decoder_weight=0.1",
            "seraena_schedule=(1,0)", "adaptive_adversarial=true"],
        "autoencoder, mixed scales, one process": common + [
            "height=64", "width=64", "half_size_every=2", "validation_sizes=32x32", "batch_size_per_gpu=2"],
    }
    problems = []
    for name, sets in runs.items():
        failure = launch(folder / re.sub(r"\W+", "_", name), sets)
        print(f"lowest-deps: {name}: {'ok' if not failure else 'FAILED'}", flush=True)
        if failure:
            problems.append(f"{name}: {failure}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("check",))
    parser.add_argument("--keep", type=Path, help="folder for the check's clips and runs (default: a temporary one)")
    args = parser.parse_args(argv)
    bounds = lower_bounds()
    problems = check_versions(bounds) or check_imports(bounds)
    if not problems:
        print("lowest-deps: " + ", ".join(f"{name} {bound}" for name, bound in bounds.items()), flush=True)
        folder = args.keep or Path(tempfile.mkdtemp(prefix="lowest-deps-"))
        folder.mkdir(parents=True, exist_ok=True)
        problems = check_training(folder)
    for problem in problems:
        print(f"lowest-deps: {problem}", file=sys.stderr)
    if not problems:
        print("lowest-deps: every requirement at its lower bound imports, and the test profile trains with every term on")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
