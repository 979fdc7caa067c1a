"""The launcher's config step and the dry run: `python -m training.plan PROFILE
[--shell|--dry-run-report|--memory|--bytes]`."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from training.config.docs import configuration_markdown
from training.config.inputs import data_root_problem, input_problems
from training.config.load import profile_overrides, stage_names
from training.config.schema import ACCELERATE_CONFIG_DIR, ConfigError, TrainConfig, error_line, tagged
from training.config.terms import schedule_lines
from training.config.views import at_largest_bucket, config_summary, model_lines


def print_memory(config: TrainConfig, check_gpu_budget: bool, problem_stream, processes_per_node: int | None = None) -> bool:
    """The memory estimate lines (and the data loaders' shared memory per node against this
    machine's /dev/shm); True (and the fix printed) when the GPU estimate exceeds gpu_memory_gb."""
    from training.data.shared_memory import shared_memory_line
    from training.plan.memory import budget_problem, estimate_memory

    estimate = estimate_memory(config)
    for line in estimate.lines(config.gpu_memory_gb if check_gpu_budget else None):
        print(f"  {line}")
    print(f"  {shared_memory_line(at_largest_bucket(config), processes_per_node)}")
    problem = budget_problem(config, estimate) if check_gpu_budget else ""
    if problem:
        print(f"config error: {problem}", file=problem_stream)
    return bool(problem)


def print_roofline(config: TrainConfig, top_ops: int = 0) -> None:
    """Each part's FLOPs, bytes and time floor on an H100 SXM (training/plan/roofline.py)."""
    from training.plan.roofline import H100, roofline_lines

    print(f"roofline floor on {H100.label()}, per micro-step on each rank (training/plan/roofline.py, "
          "docs/performance.md#roofline-floors):")
    for line in roofline_lines(config, top_ops=top_ops):
        print(f"  {line}")


def shell_tagged_values(config: TrainConfig) -> dict:
    """The keys the launcher reads as they are, by their shell names (option(..., shell="NAME") in
    training/config/schema.py); a bool as 1/0, for bash's (( ))."""
    values = {name: getattr(config, key) for key, name in tagged("shell").items()}
    return {name: int(value) if isinstance(value, bool) else value for name, value in values.items()}


def visible_gpu_count() -> int:
    """CUDA devices this process sees (0 without a CUDA build). The launcher compares it with NGPU;
    a *_cpu.yaml launch is a CPU run whatever it is (the launcher hides the GPUs), the cpu and test
    profiles with another file only where it is 0. A CPU-only torch build is read from
    torch/version.py, without importing torch (~2 s of every CPU launch)."""
    spec = importlib.util.find_spec("torch")
    version = Path(next(iter(spec.submodule_search_locations or []), ""), "version.py") if spec else None
    if version is not None and version.is_file():
        built_for = {name: re.search(rf"^{name}(?:: [^=]+)? = (.+)$", version.read_text(), re.M) for name in ("cuda", "hip")}
        if all(match is not None and match.group(1).strip() == "None" for match in built_for.values()):
            return 0
    import torch

    try:
        return torch.cuda.device_count()
    except Exception:  # a broken driver reads as no GPU here; the launch itself reports the real error
        return 0


def main(argv: list[str] | None = None) -> int:
    """CLI used by the launchers: validate and print the resolved config (or shell variables)."""
    import argparse
    import shlex
    import sys

    parser = argparse.ArgumentParser(prog="python -m training.plan", description="Resolve and validate a training config.")
    parser.add_argument("profile", nargs="?", help="profile name or path of a .py config file")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--processes-per-node", type=int,
                        help="processes on this machine (the launcher's NGPU; default --num-processes): the data "
                             "loaders' shared memory per node is checked against /dev/shm (training/data/shared_memory.py)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output-dir", default="", help="the run folder (as the launcher's --output-dir)")
    parser.add_argument("--resume", default="", help="as the launcher's --resume: a resume of a recorded run restores "
                        "its settings (training/run/folder.py)")
    parser.add_argument("--refuse-busy-run-folder", action="store_true",
                        help="exit 2 when a training holds the run folder (the launcher's first step on machine 0)")
    parser.add_argument("--no-check-paths", action="store_true", help="skip the existence checks of paths")
    parser.add_argument("--shell", action="store_true", help="print KEY=value lines for the launchers")
    parser.add_argument("--list-input-problems", action="store_true",
                        help="print every missing or unreadable input with its fix (exit 1 if any) instead of the config")
    parser.add_argument("--quiet", action="store_true", help="do not repeat the notes on an old-style config file")
    parser.add_argument("--memory", action="store_true", help="print the memory estimate per rank (training/plan/memory.py)")
    parser.add_argument("--check-gpu-budget", action="store_true",
                        help="with --memory: exit 1 with the fix when the GPU estimate exceeds gpu_memory_gb")
    parser.add_argument("--dry-run-report", action="store_true",
                        help="the launcher's dry run in one process: resolved config, memory estimate and every input "
                             "problem (exit 1: inputs missing, 3: GPU estimate over budget with --check-gpu-budget)")
    parser.add_argument("--bytes", action="store_true", help="print each part's FLOPs, bytes moved and roofline floor, "
                        "with its top ops by bytes (training/plan/roofline.py)")
    parser.add_argument("--markdown", action="store_true", help="print docs/configuration.md")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(configuration_markdown())
        return 0
    if not args.profile:
        parser.error("a profile or config file is required")
    from training.run.folder import check_not_in_use, load_run

    notes: list[str] = []
    try:
        run = load_run(args.profile, args.overrides, args.num_processes, args.output_dir, args.resume,
                       # the estimates need no input on disk: --memory and --bytes run on a bare machine, as the docs print them
                       check_paths=not (args.no_check_paths or args.list_input_problems or args.dry_run_report
                                        or args.memory or args.bytes), notes=notes,
                       several_machines=bool(args.processes_per_node and args.num_processes
                                             and args.num_processes > args.processes_per_node))
        if args.refuse_busy_run_folder:
            check_not_in_use(run.run_dir)
        config = run.config
        legacy_notes: list[str] = []
        _, source = profile_overrides(args.profile, legacy_notes)
    except ConfigError as error:
        print(error_line(error), file=sys.stderr)
        return 2
    for note in [] if args.quiet else legacy_notes:  # an old-style `args` file: what was renamed, adjusted or dropped
        print(f"legacy config: {note}", file=sys.stderr)
    for note in [] if args.quiet else notes:  # said once per launch: the launcher's first step is not quiet
        print(note, file=sys.stderr)
    if args.dry_run_report:
        if run.restored:
            print(f"resume: the settings of {run.run_dir} ({len(run.changes)} changed by this launch)")
            for line in run.change_lines():
                print(f"  {line}")
        print("resolved config:")
        print(config_summary(config))
        print("model:")
        for line in model_lines(config):
            print(f"  {line}")
        print("loss schedule (in optimizer steps; docs/training.md#loss-schedules):")
        for line in schedule_lines(config):
            print(f"  {line}")
        from training.data.buckets import bucket_lines

        if config.buckets:  # aspect buckets: their share of the clips; the estimates below are at the largest
            print("buckets (training/data/buckets.py, docs/data.md#aspect-buckets):")
            for line in bucket_lines(config):
                print(f"  {line}")
        print("memory (estimated per rank; training/plan/memory.py, docs/performance.md):")
        over_budget = print_memory(config, args.check_gpu_budget, sys.stdout, args.processes_per_node)
        from training.plan.decode_budget import compute_line, decode_budget_lines

        if not config.accelerate_config.endswith("_cpu.yaml"):
            print("compute (training/plan/step_flops.py):")
            print(f"  {compute_line(at_largest_bucket(config))}")
            print_roofline(at_largest_bucket(config))
            from training.plan.cache_cost import cache_cost_lines

            lines = cache_cost_lines(at_largest_bucket(config))
            if lines:
                print("latent cache against the teacher on the fly (training/plan/cache_cost.py, "
                      "docs/performance.md#the-latent-cache-as-the-production-path):")
                for line in lines:
                    print(f"  {line}")

        if config.compile or config.ref_vae_compile:
            from models.measure_cache import compile_cache_dir

            what = " and ".join(["the student"] * config.compile + ["the reference encode"] * config.ref_vae_compile)
            print(f"compile ({what}, backend {config.compile_backend}; docs/performance.md#compile):")
            print(f"  the first micro-step compiles (train.log says how long); artefacts cached in {compile_cache_dir()}")
        budget = decode_budget_lines(at_largest_bucket(config))
        if budget:
            print("data loading (training/plan/decode_budget.py):")
            for line in budget:
                print(f"  {line}")
        print("inputs:")
        problems = input_problems(config) + [problem for problem in [data_root_problem(config)] if problem]
        for problem in problems:
            print(f"  missing: {problem}")
        if not problems:
            print("  ok: every file and folder the config names is there")
        return 1 if problems else 3 if over_budget else 0
    if args.bytes:
        print_roofline(at_largest_bucket(config), top_ops=12)
        return 0
    if args.memory:
        return 1 if print_memory(config, args.check_gpu_budget, sys.stderr, args.processes_per_node) else 0
    if args.list_input_problems:
        problems = input_problems(config)
        for problem in problems:
            print(f"  missing: {problem}")
        return 1 if problems else 0
    if args.shell:
        from training.data.shared_memory import shared_memory_problem

        shell_values = {
            "CONFIG_SOURCE": source,
            "ACCELERATE_CONFIG_FILE": str(ACCELERATE_CONFIG_DIR / config.accelerate_config),
            **shell_tagged_values(config),
            "CONFIG_CLIP": f"{config.n_frames} frames of {config.height}x{config.width} ({config.latent_frames} latent frames)"
                           + (f", trained in buckets {', '.join(f'{h}x{w}' for h, w in config.buckets)}" if config.buckets else ""),
            "RUN_DIR": run.run_dir,
            "CONFIG_REF_VAE": config.ref_vae_path if config.use_ref_vae else "(autoencoder mode)",
            "CONFIG_MODEL": " | ".join(model_lines(config)),
            "VISIBLE_GPUS": visible_gpu_count(),  # 0 also decides a cpu/test launch is a CPU run (the launcher)
            "CONFIG_STAGES": " ".join(f"{name}:{dict(entry)['steps']}" for name, entry in zip(stage_names(config.stages), config.stages)),
            # /dev/shm against the data loaders of this node ('' when it fits): refused, or a warning
            "SHM_PROBLEM": shared_memory_problem(at_largest_bucket(config), args.processes_per_node),
        }
        for key, value in shell_values.items():
            print(f"{key}={shlex.quote(str(value))}")
    else:
        print(config_summary(config))
    return 0

