"""How many CPU cores the data loader needs per GPU, printed by the dry run.

Cost per clip: `core_s_per_clip` in docs/data_benchmark.json, written by
`python -m scripts.benchmark_data --decode-cost-only --json docs/data_benchmark.json`: CPU seconds
(one core, one decoder thread) to draw one training clip at the h100 clip shape from 1080p H.264
sources with 250-frame GOPs (`raw`) and from the same after scripts/prepare_dataset.py
(`prepared`), measured on the machine named in that file; a faster core needs proportionally less.
Rate: the profile's clips/s per GPU if its step ran at ASSUMED_MFU of an H100's dense bf16 peak
(FLOPs of one micro-step from training/plan/step_flops.py). Each loader worker is one process, about
one core.
"""

from __future__ import annotations

import json
from pathlib import Path

from training.plan.roofline import H100, PART_NAMES

BENCHMARK = Path(__file__).resolve().parents[2] / "docs" / "data_benchmark.json"
ASSUMED_MFU = 0.4
PEAK_FLOPS = H100.peak_flops  # dense bf16 (training/plan/roofline.py DEVICE_SPECS)


def step_tflops(config) -> float:
    return step_tflops_by_part(config)["total"]


def step_tflops_by_part(config) -> dict[str, float]:
    """TFLOPs of one micro-step by part (training/plan/step_flops.py: counted once per shape on the
    meta device and kept in ~/.cache/taehv/step_costs.json, so repeated dry runs do not count again)."""
    from training.plan.step_flops import step_flops

    return {part: flops / 1e12 for part, flops in step_flops(config).items()}




def compute_line(config) -> str:
    """The micro-step's FLOPs by part, with the teacher's share: where it dominates, its speed
    (ref_vae_channels_last, a latent cache) matters more than the student's."""
    parts = step_tflops_by_part(config)
    total = parts["total"]
    shares = ", ".join(f"{PART_NAMES.get(part, part)} {value:.1f}" for part, value in parts.items() if part != "total" and value)
    line = f"{total:.1f} TFLOP per micro-step on each rank: {shares}"
    if parts.get("reference"):
        line += (f"; the reference VAE's encode is {parts['reference'] / total:.0%} of it (ref_vae_channels_last="
                 f"{str(config.ref_vae_channels_last).lower()}; make gpu-check times both layouts; a latent cache "
                 "removes it)")
    return line


def expected_clips_per_s(config) -> float:
    return config.batch_size_per_gpu / (step_tflops(config) * 1e12 / (ASSUMED_MFU * PEAK_FLOPS))


def data_is_prepared(config) -> bool:
    from training.data.index import is_prepared_dataset

    try:
        return is_prepared_dataset(config.data_root, retry_s=1)
    except Exception:  # an unreachable store is reported by the input checks
        return False


def decode_budget_lines(config, clips_per_s: float | None = None, prepared: bool | None = None) -> list[str]:
    """The dry run's lines for a GPU profile ([] for cpu/test profiles or without the benchmark file)."""
    if config.accelerate_config.endswith("_cpu.yaml") or not BENCHMARK.is_file():
        return []
    measured = json.loads(BENCHMARK.read_text())
    prepared = data_is_prepared(config) if prepared is None else prepared
    kind = "prepared" if prepared else "raw"
    cost = measured["core_s_per_clip"][kind]
    rate = expected_clips_per_s(config) if clips_per_s is None else clips_per_s
    cores = rate * cost
    lines = [f"~{cores:.1f} decoding cores per GPU at ~{rate:.1f} clips/s per GPU ({kind} clips: {cost:.3f} core-s each, "
             f"measured by scripts/benchmark_data.py on {measured.get('machine', 'the CI machine')}; step at "
             f"{ASSUMED_MFU:.0%} MFU; docs/data.md#decode-budget)"]
    if config.num_workers < cores:
        advice = ("raise num_workers" if prepared else
                  "prepare the data once (python -m scripts.prepare_dataset, docs/data.md) or raise num_workers")
        lines.append(f"warning: num_workers={config.num_workers} loader processes per GPU cannot deliver that: the GPU will "
                     f"wait for clips; {advice}")
    return lines
