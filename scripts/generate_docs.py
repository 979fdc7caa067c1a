"""Numbers the docs quote, generated from the code so they cannot drift:

    python -m scripts.generate_docs           # rewrite every generated part in place
    python -m scripts.generate_docs --check   # exit 1 naming each part that is out of date

A generated part sits between `<!-- generated: NAME -->` and `<!-- end generated -->` in a doc;
NAME is a key of GENERATORS. docs/configuration.md as a whole comes from
`python -m training.plan --markdown` (tests/test_config.py checks it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PART = re.compile(r"(<!-- generated: (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)
MEMORY_PROFILES = (("1gpu_h100", 1), ("h100", 8), ("16gpu_h100", 16), ("64gpu_h100", 64), ("a800", 8))


def memory_table() -> str:
    """docs/performance.md: the dry run's estimate per rank for each GPU profile (training/plan/memory.py)."""
    from training.config.load import load_config
    from training.plan.memory import HEADROOM, estimate_memory

    lines = ["| profile | training step, measured (GB) | GPU per rank (GB, of 80) | host per rank (GB) | checkpoint folder (GB, all ranks) |",
             "|---|---|---|---|---|"]
    for profile, processes in MEMORY_PROFILES:
        config = load_config(profile, num_processes=processes, check_paths=False)
        estimate = estimate_memory(config)
        above = " (above 90%)" if HEADROOM * config.gpu_memory_gb < estimate.gpu_gb else ""
        lines.append(f"| `{profile}` ({config.n_frames} frames, batch {config.batch_size_per_gpu}) | "
                     f"{estimate.gpu['training step']:.1f} | {estimate.gpu_gb:.1f}{above} | {estimate.host_gb:.1f} | "
                     f"{estimate.checkpoint_gb:.2f} |")
    return "\n".join(lines) + "\n"


def flops_table() -> str:
    """docs/performance.md: FLOPs of one h100 micro-step per GPU by part (training/plan/step_flops.py,
    as `python -m scripts.benchmark --profile h100 --dry-run` prints them) and the ceilings."""
    from training.config.load import load_config
    from training.plan.roofline import H100
    from training.plan.step_flops import step_flops

    spec_peak = H100.peak_flops
    config = load_config("h100", num_processes=8, check_paths=False)
    flops = step_flops(config)
    names = {"student": "student (encode, decode of the reference latents, round trip; forward + backward)",
             "lpips": "LPIPS (forward, backward to the frames)", "seraena": "Seraena (discriminator step, correction)",
             "reference": "reference VAE encode (CogVideoX-2b architecture)"}
    lines = [f"h100 profile ({config.model_variant}, {config.batch_size_per_gpu} clips x {config.n_frames} frames x "
             f"{config.height}x{config.width} per GPU, {config.mixed_precision}, all five loss terms), per", "micro-step per GPU:",
             "", "| part | TFLOP | share |", "|---|---|---|"]
    lines += [f"| {label} | {flops[part] / 1e12:.1f} | {flops[part] / flops['total']:.1%} |" for part, label in names.items()]
    cached = flops["total"] - flops["reference"]
    lines += [f"| **total** | **{flops['total'] / 1e12:.1f}** | |", "",
              f"At H100 SXM's spec dense bf16 peak ({spec_peak / 1e12:.0f} TFLOP/s) that is "
              f"{config.batch_size_per_gpu / (flops['total'] / spec_peak):.1f} clips/s per GPU with the reference",
              f"on the fly and {config.batch_size_per_gpu / (cached / spec_peak):.1f} with latents from the cache "
              f"({cached / 1e12:.1f} TFLOP): the ceilings."]
    return "\n".join(lines) + "\n"


def roofline_table() -> str:
    """docs/performance.md: each part's FLOPs, bytes and floor on an H100 SXM at the h100 shape
    (training/plan/roofline.py, as `python -m training.plan h100 --bytes` prints them)."""
    from training.config.load import load_config
    from training.plan.roofline import H100, PART_NAMES, floors, shown
    from training.plan.step_flops import step_costs

    config = load_config("h100", num_processes=8, check_paths=False)
    costs = step_costs(config)
    floor = floors(costs, H100)
    lines = [f"| part | TFLOP | GB moved | FLOP floor (ms) | bytes floor (ms) | floor on {H100.name} (ms) |", "|---|---|---|---|---|---|"]
    for part, cost in costs.items():
        bold = "**" if part == "total" else ""
        lines.append(f"| {bold}{PART_NAMES[part]}{bold} | {shown(cost['flops'] / 1e12)} | {shown(cost['bytes'] / 1e9)} | "
                     f"{shown(cost['flops'] / H100.peak_flops * 1e3)} | {shown(cost['bytes'] / H100.bandwidth * 1e3)} | "
                     f"{bold}{shown(floor[part] * 1e3)}{bold} |")
    batch, cached = config.batch_size_per_gpu, floor["total"] - floor["reference"]
    top = sorted(costs["student"]["ops"].items(), key=lambda item: -item[1])[:8]
    lines += ["", f"The floor of a micro-step of {batch} clips: {floor['total'] * 1e3:.0f} ms with the reference VAE on the "
              f"fly (at most {batch / floor['total']:.1f} clips/s per GPU),",
              f"{cached * 1e3:.0f} ms with latents cached (at most {batch / cached:.1f}). The student's bytes by op:",
              ", ".join(f"`{op}` {moved / 1e9:.1f} GB" for op, moved in top) + "."]
    return "\n".join(lines) + "\n"


def decode_cost_table() -> str:
    """docs/data.md: the decode budget from docs/data_benchmark.json (scripts/benchmark_data.py)."""
    import json

    from training.config.load import load_config
    from training.plan.decode_budget import ASSUMED_MFU, BENCHMARK, expected_clips_per_s

    measured = json.loads(BENCHMARK.read_text())
    rate = expected_clips_per_s(load_config("h100", num_processes=8, check_paths=False))
    lines = [f"Measured on {measured['machine']} (PyAV {measured['pyav']}): {measured['decode_cost_clip']}; sources: "
             f"{measured['decode_cost_sources']}.", "",
             f"| data | core-s per clip | clips/s per worker | cores per H100 at {rate:.1f} clips/s ({ASSUMED_MFU:.0%} MFU) |",
             "|---|---|---|---|"]
    for kind, label in (("raw", "raw 1080p sources, 250-frame GOPs"), ("prepared", "the same after `prepare_dataset`")):
        cost = measured["core_s_per_clip"][kind]
        lines.append(f"| {label} | {cost:.3f} | {measured['clips_per_s_per_worker'][kind]:.2f} | {rate * cost:.1f} |")
    lines += ["", f"Prepared over raw: {measured['prepared_over_raw']:.3f}. Preparing cost "
              f"{measured['prepare_core_s_per_source_second']:.2f} core-s per second of 1080p source (once)."]
    return "\n".join(lines) + "\n"


def recipe_table() -> str:
    """docs/training.md: the named recipes (training/config/recipes.py) with their sources."""
    from training.config.recipes import RECIPES

    lines = ["| `--recipe` | what it trains with | source | sets | differs from its source |", "|---|---|---|---|---|"]
    for recipe in RECIPES.values():
        values = ", ".join(f"`{key}={value}`" for key, value in recipe.values.items())
        lines.append(f"| `{recipe.name}` | {recipe.summary} | {recipe.source} | {values} | {recipe.note or '-'} |")
    return "\n".join(lines) + "\n"


GENERATORS = {"memory-table": memory_table, "flops-table": flops_table, "roofline-table": roofline_table,
              "decode-cost-table": decode_cost_table, "recipe-table": recipe_table}


def updated(text: str, cache: dict) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(2)
        if name not in GENERATORS:
            raise SystemExit(f"unknown generated part {name!r}: one of {', '.join(GENERATORS)}")
        if name not in cache:
            cache[name] = GENERATORS[name]()
        return match.group(1) + cache[name] + match.group(4)

    return PART.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming the stale docs")
    args = parser.parse_args(argv)
    cache: dict = {}
    stale = []
    for doc in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]:
        text = doc.read_text()
        new = updated(text, cache)
        if new != text:
            stale.append(str(doc.relative_to(REPO_ROOT)))
            if not args.check:
                doc.write_text(new)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}: run python -m scripts.generate_docs", file=sys.stderr)
        return 1
    for doc in [] if args.check else stale:
        print(f"updated {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
