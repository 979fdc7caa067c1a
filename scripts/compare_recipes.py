"""Train the recipe presets (training/config/recipes.py) and the profile's own default from the same
start, on the same clips, for the same steps, then score each on the clips they all held out:

    python -m scripts.compare_recipes                    # cpu profile, demo clips, 300 steps each
    python -m scripts.compare_recipes --steps 600 --write-docs
    python -m scripts.compare_recipes --profile h100 --ngpu 8 --steps 20000 --frames 17 --height 480 --width 720
    python -m scripts.compare_recipes --candidate "no_chroma chroma_weight=0" --candidate "at32 height=32 width=32 half_size_every=0" --sizes 32x32,64x64

A --candidate is a name and the --set items of a run of the profile (its own max_steps among them,
for a comparison at equal wall time: the table gives each run's training wall time and CPU time);
--sizes scores every run at each size, beside the 8x8 block average there.

Each run is the launcher's (`./train_taehv_h100.sh NGPU PROFILE --recipe NAME`), each score is
inference.py's report on the held-out clips. Writes OUT/results.json and OUT/results.md; with
--write-docs also the table in docs/benchmarks.md#recipe-evidence-scriptscompare_recipespy. At CPU scale it is evidence of the
method on tiny crops and short runs, not of the recipes at their published scale:
- a schedule's published start (VidTok's step 20,001, Open-Sora's "near convergence") is placed at
  the same fraction of this run (--late-fraction), its critic warm-up and ramp in proportion;
- without LPIPS files (--lpips-backbone/--lpips-heads, or the torch hub cache) the perceptual
  term is off, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- measured: recipe-evidence -->\n", "<!-- end measured -->"
# what the table shows from inference.py's report.json "mean", and how
COLUMNS = (("psnr", "PSNR (dB)", 2), ("chroma_psnr", "chroma PSNR (dB)", 2), ("colourfulness_ratio", "colourfulness", 2),
           ("warping_error", "warping error", 4), ("ssim", "SSIM", 3))


def scaled_schedule(recipe: str, steps: int, late_fraction: float) -> list[str]:
    """--set items that move a recipe's late adversarial start into a run of `steps` steps."""
    from training.config.recipes import RECIPES

    values = RECIPES[recipe].values if recipe in RECIPES else {}
    start, ramp = values.get("seraena_schedule") or (0, 0)
    if not start:
        return []
    new_start = int(steps * late_fraction)
    sets = [f"seraena_schedule={new_start},{max(0, round(ramp * new_start / start))}"]
    warm_up = values.get("discriminator_start_step", -1)
    if warm_up >= 0:
        sets.append(f"discriminator_start_step={round(warm_up * new_start / start)}")
    return sets


def lpips_sets(args) -> tuple[list[str], bool]:
    """(--set items that point at the LPIPS files, whether they are there)."""
    from models.metrics import LPIPSUnavailable, find_lpips_weights

    try:
        backbone, heads = find_lpips_weights(args.lpips_backbone, args.lpips_heads)
    except LPIPSUnavailable:
        return [], False
    return [f"lpips_backbone_path={backbone}", f"lpips_weights_path={heads}"], True


def free_port() -> int:
    with socket.socket() as probe:  # another run on this machine may hold the launcher's default port
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_logged(command: list[str], log: Path) -> tuple[int, float, float]:
    """(exit code, wall s, CPU s of the command and everything it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = {**os.environ, "MASTER_PORT": os.environ.get("MASTER_PORT", str(free_port()))}
    with open(log, "w") as out:
        code = subprocess.run(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, time.perf_counter() - start, cpu


def parse_candidate(text: str) -> tuple[str, list[str]]:
    """'NAME KEY=VALUE ...' -> (NAME, its --set items)."""
    name, *sets = text.split()
    if "=" in name or not all("=" in item for item in sets):
        raise SystemExit(f"--candidate {text!r}: expected a name, then KEY=VALUE items, e.g. "
                         "--candidate 'at32 height=32 width=32 half_size_every=0 max_steps=400'")
    return name, sets


def parse_sizes(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(h), int(w)) for h, w in (size.lower().split("x") for size in text.split(",") if size.strip())]
    except ValueError:
        raise SystemExit(f"--sizes {text}: expected HEIGHTxWIDTH items separated by commas, e.g. --sizes 32x32,64x64") from None


def train_and_score(name: str, args, lpips: list[str], have_lpips: bool, candidate_sets: list[str] | None = None) -> dict:
    run_dir = args.out / name
    sets = [f"max_steps={args.steps}", f"seed={args.seed}", *args.set]
    notes = []
    if candidate_sets is not None:  # its own items last: they win, its max_steps included
        sets += candidate_sets
    elif name != "default":
        sets += [f"recipe={name}", *scaled_schedule(name, args.steps, args.late_fraction)]
    from training.config.load import load_config

    config = load_config(args.profile, sets, args.ngpu, check_paths=False)
    if config.perceptual_weight > 0:
        if have_lpips:
            sets += lpips
        else:
            sets.append("perceptual_weight=0")
            notes.append(f"perceptual {config.perceptual_weight:g} off: no LPIPS files")
    if config.seraena_schedule:
        notes.append(f"adversarial from step {config.seraena_schedule[0]}")
    command = [str(REPO_ROOT / "train_taehv_h100.sh"), str(args.ngpu), args.profile, "--output-dir", str(run_dir)]
    for item in sets:
        command += ["--set", item]
    run_dir.mkdir(parents=True, exist_ok=True)
    code, wall, cpu = run_logged(command, args.out / f"{name}.train.log")
    if code != 0:
        raise SystemExit(f"{name}: training failed (exit {code}); see {args.out / f'{name}.train.log'}")
    scores = {f"{height}x{width}": score_at(name, run_dir, height, width, args, lpips if have_lpips else [])
              for height, width in args.sizes}
    return {"recipe": name, "sets": candidate_sets or [], "steps": config.max_steps, "train_wall_s": round(wall, 1),
            "cpu_minutes": round(cpu / 60, 1), "notes": notes, "scores": scores}


def score_at(name: str, run_dir: Path, height: int, width: int, args, lpips: list[str]) -> dict:
    """inference.py's report on the held-out clips at height x width: the clip count, the model's and the baseline's means."""
    size = f"{height}x{width}"
    evaluation = run_dir / f"evaluation_{size}"
    score = [sys.executable, str(REPO_ROOT / "inference.py"), "--model", str(run_dir), "--held-out-of", str(run_dir),
             "--frames", str(args.frames), "--height", str(height), "--width", str(width), "--no-media",
             "--out", str(evaluation), "--device", "cpu"]
    if lpips:
        score += ["--lpips-backbone", lpips[0].split("=", 1)[1], "--lpips-heads", lpips[1].split("=", 1)[1]]
    code, _, _ = run_logged(score, args.out / f"{name}.evaluate_{size}.log")
    if code != 0:
        raise SystemExit(f"{name}: evaluation at {size} failed (exit {code}); see {args.out / f'{name}.evaluate_{size}.log'}")
    report = json.loads((evaluation / "report.json").read_text())
    return {"clips": len(report["clips"]), "mean": report["mean"], "baseline": report.get("baseline", {}).get("mean", {})}


def markdown(results: list[dict], args) -> str:
    many = len(args.sizes) > 1  # a column per metric and size; one size keeps the columns' plain names
    sizes = [f"{height}x{width}" for height, width in args.sizes]
    labels = [f"{label} at {size}" if many else label for size in sizes for _, label, _ in COLUMNS]
    header = "| recipe | steps | train wall | " + " | ".join(labels) + " | CPU-minutes | notes |"
    lines = [header, "|" + "---|" * (len(labels) + 5)]

    def cells(means: list[dict]) -> str:
        return " | ".join(f"{mean[key]:.{digits}f}" if isinstance(mean.get(key), (int, float)) else "-"
                          for mean in means for key, _, digits in COLUMNS)

    for result in results:
        name = f"`{result['recipe']}`" + (f" (`{' '.join(result['sets'])}`)" if result["sets"] else "")
        minutes, seconds = divmod(round(result["train_wall_s"]), 60)
        lines.append(f"| {name} | {result['steps']} | {minutes} m {seconds:02d} s | "
                     + cells([result["scores"][size]["mean"] for size in sizes])
                     + f" | {result['cpu_minutes']} | {'; '.join(result['notes']) or '-'} |")
    if results and all(results[0]["scores"][size]["baseline"] for size in sizes):
        lines.append("| 8x8 block average (no model) | - | - | " + cells([results[0]["scores"][size]["baseline"] for size in sizes])
                     + " | - | the blur to beat |")
    command = (f"python -m scripts.compare_recipes --profile {args.profile} --ngpu {args.ngpu} --steps {args.steps} "
               f"--frames {args.frames} --sizes {','.join(sizes)}" + (f" --recipes {args.recipes}" if args.recipes else "")
               + "".join(f" --candidate '{text}'" for text in args.candidate)
               + "".join(f" --set {item}" for item in args.set) + (" --write-docs" if args.write_docs else ""))
    clips = results[0]["scores"][sizes[0]]["clips"] if results else 0
    return ("\n".join(lines) + "\n\n"
            f"The `{args.profile}` profile on {args.ngpu} process(es), seed {args.seed}, from scratch, {args.steps} optimizer "
            f"steps unless a run sets max_steps; scored on the {clips} held-out clips at {args.frames} frames of "
            f"{', '.join(sizes)}. Measured with `{command}` on {os.cpu_count()} CPU cores ({time.strftime('%Y-%m-%d')}).\n")


def write_docs(table: str) -> None:
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOCS}: no {BEGIN.strip()} ... {END} part to write the table into")
    head, rest = text.split(BEGIN, 1)
    DOCS.write_text(head + BEGIN + table + END + rest.split(END, 1)[1])


def main(argv: list[str] | None = None) -> int:
    from training.config.recipes import RECIPES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--ngpu", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--recipes", default=None,
                        help="comma-separated: default (the profile as it is) and recipe names; all of them unless "
                             "--candidate is given, then none unless named")
    parser.add_argument("--candidate", action="append", default=[], metavar="'NAME KEY=VALUE ...'",
                        help="a run of the profile with these --set items (repeatable), e.g. 'at32 height=32 width=32 half_size_every=0 max_steps=400'")
    parser.add_argument("--late-fraction", type=float, default=0.5,
                        help="where a recipe's late adversarial start is placed, as a fraction of --steps")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--height", type=int, default=32, help="the size scored, when --sizes is not given")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--sizes", default="", help="HEIGHTxWIDTH sizes to score each run at, e.g. 32x32,64x64")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run")
    parser.add_argument("--lpips-backbone", default="")
    parser.add_argument("--lpips-heads", default="")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "output" / "compare_recipes")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.recipes is None:
        args.recipes = "" if args.candidate else ",".join(["default", *RECIPES])
    args.sizes = parse_sizes(args.sizes) if args.sizes else [(args.height, args.width)]
    candidates = dict(parse_candidate(text) for text in args.candidate)
    names = [name.strip() for name in args.recipes.split(",") if name.strip()]
    if set(names) & set(candidates) or len(candidates) < len(args.candidate):
        parser.error("--candidate: each name must differ from the other candidates' and from --recipes")
    unknown = [name for name in names if name != "default" and name not in RECIPES]
    if unknown:
        parser.error(f"--recipes: {', '.join(unknown)} unknown; choose from default, {', '.join(RECIPES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    lpips, have_lpips = lpips_sets(args)
    results = []
    for name, candidate_sets in [*((name, None) for name in names), *candidates.items()]:
        print(f"{name}: training ...", flush=True)
        results.append(train_and_score(name, args, lpips, have_lpips, candidate_sets))
        for size, score in results[-1]["scores"].items():
            mean = score["mean"]
            print(f"{name} at {size}: " + ", ".join(f"{label} {mean.get(key, float('nan')):.{digits}f}"
                                                    for key, label, digits in COLUMNS), flush=True)
        print(f"{name}: {results[-1]['steps']} steps, {results[-1]['train_wall_s']} s, {results[-1]['cpu_minutes']} CPU-min",
              flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
    table = markdown(results, args)
    (args.out / "results.md").write_text(table)
    print(table)
    if args.write_docs:
        write_docs(table)
        print(f"wrote the table into {DOCS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
