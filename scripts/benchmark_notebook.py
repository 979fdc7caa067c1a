"""Our training step beside the published notebook's, at its shape, in one process, alternating;
a measurement, not a test. Prints JSON (and writes it with --json).

    python -m scripts.benchmark_notebook --taehv-dir ../taehv --seraena-dir ../seraena [--rounds 5]

The notebook is madebyollin/seraena's TAEHV_Training_Example.ipynb: batch 16, 12 frames, 64x64
crops, the student in fp32 under fp16 autocast with a GradScaler on CUDA (taew2_1's layout, 16 latent
channels), AdamW 3e-4, an encoder MSE to
the reference latents, the decoder on the reference latents with an MSE to the frames and one to
Seraena's corrected targets (3-frame groups, the discriminator updated every step). Its step is
rebuilt here from upstream's own taehv.py and seraena.py (the folders of checkouts of
madebyollin/taehv and madebyollin/seraena; TAEHV_UPSTREAM_DIR and SERAENA_UPSTREAM_DIR by
default). Ours is scripts/benchmark.py's profile_step (the trainer's step and builders) on the
`1gpu_h100` profile (bf16, as it runs on a GPU) with the `seraena-notebook` recipe at the same shapes, reference latents given
(the round trip off: the notebook decodes the reference latents only). Ours is set to 9 frames:
the Wan VAE's clips are 4k+1 frames, and 9 frames are the notebook's 3 latent frames, its 12
encoded frames (the encoder pads with the last frame) and its 9 decoded frames. Both leave out data
loading, the reference VAE's encode and the weight average. Each round times one step of each,
after two warm-up steps of each, on whatever device is here (on a CPU the notebook's step runs
without autocast). The step is scripts/notebook_recipe.py's notebook_train_step, which the host
count (--host) also runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from scripts.benchmark import PhaseTimer, profile_step
from scripts.notebook_recipe import BATCH, FRAMES, OUR_FRAMES, SIZE, notebook_train_step, upstream_files
from scripts.results import emit_result
from training.base.fast_exit import exit_now

def our_step(device: torch.device, sets: list[str]):
    from training.config.load import load_config

    config = load_config("1gpu_h100", ["recipe=seraena-notebook", "use_ref_vae=true", "ref_vae_family=wan", "model_variant=taew2_1",
                                 "reconstruction_weight=0", f"batch_size_per_gpu={BATCH}", f"n_frames={OUR_FRAMES}",
                                 f"height={SIZE}", f"width={SIZE}", "gradient_accumulation_steps=1", "global_batch_size=0", *sets],
                         check_paths=False)
    step, window = profile_step(config, device, cached_latents=True)
    assert window == 1
    return step, config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--taehv-dir", type=Path, help="a checkout of madebyollin/taehv (default TAEHV_UPSTREAM_DIR, ../taehv)")
    parser.add_argument("--seraena-dir", type=Path, help="of madebyollin/seraena (default SERAENA_UPSTREAM_DIR, ../seraena)")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps of each, alternating")
    parser.add_argument("--set", action="append", default=[], help="a config override for our step (KEY=VALUE)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--host", action="store_true", help="count what each step costs the host (kernel-launching ops, "
                        "views, syncs, host ms at a 16x16 crop) on this CPU, for both sides: scripts/host_cost.py")
    parser.add_argument("--processes", type=int, default=1, help="with --host: count a multi-process step per rank, on this "
                        "many CPU processes under each of --engines, at the notebook's recipe and at --profile's shape "
                        "scaled down in space (the notebook's side is not run)")
    parser.add_argument("--profile", default="h100", help="with --processes: the profile whose step is counted")
    parser.add_argument("--engines", default="ddp,zero2,zero3", help="with --processes: of ddp, zero2, zero3")
    parser.add_argument("--shapes", default="notebook_recipe,profile_shape", help="with --processes: of notebook_recipe, profile_shape")
    args = parser.parse_args(argv)
    command = " ".join([sys.executable, "-m", "scripts.benchmark_notebook", *(argv if argv is not None else sys.argv[1:])])
    if args.host and args.processes > 1:
        from scripts.host_cost import main as host_cost

        emit_result({"command": command, "host": host_cost(None, None, args.set, args.profile, processes=args.processes,
                                                           engines=tuple(args.engines.split(",")), shapes=tuple(args.shapes.split(",")))},
                    args.json)
        return 0
    files = upstream_files(args.taehv_dir, args.seraena_dir)
    args.taehv_dir, args.seraena_dir = (path.parent for path in files)
    for path in files:
        if not path.is_file():
            raise SystemExit(f"{path} not found: point --taehv-dir / --seraena-dir at checkouts of madebyollin/taehv and "
                             "madebyollin/seraena (or set TAEHV_UPSTREAM_DIR / SERAENA_UPSTREAM_DIR)")
    if args.host:
        from scripts.host_cost import main as host_cost

        emit_result({"command": command, "host": host_cost(args.taehv_dir, args.seraena_dir, args.set)}, args.json)
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp = torch.float16 if device.type == "cuda" else None  # the notebook's autocast and GradScaler on CUDA
    steps = {"notebook": notebook_train_step(args.taehv_dir, args.seraena_dir, device, amp_dtype=amp)}
    steps["ours"], config = our_step(device, args.set)
    timer = PhaseTimer(device)  # scripts/benchmark.py's: synchronized around each step
    for _ in range(args.rounds + 2):
        for name, step in steps.items():
            timer(name, step)
    medians = timer.medians(2)
    times = {name: values[2:] for name, values in timer.times.items()}
    result = {
        "command": command,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads",
        "shape": {"batch": BATCH, "frames": FRAMES, "height": SIZE, "width": SIZE, "variant": config.model_variant,
                  "precision": config.mixed_precision},
        "seconds_per_step": medians,
        "all_seconds": times,
        "ours_over_notebook": medians["ours"] / medians["notebook"],
    }
    emit_result(result, args.json)
    return 0


if __name__ == "__main__":
    exit_now(main())
