"""TAEHV training entry point, started by the launchers through `accelerate launch`:

    accelerate launch --config_file accelerate_configs/ddp_cpu.yaml --num_processes 2 \
        training/taehv_train.py --config test --output-dir output/run1 [--set key=value] [--resume latest]

The loop itself is training/loop/train.py; docs/architecture.md draws the layers.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file by accelerate launch: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":
    # The first act, before torch and the trainer load (seconds): a rank whose agent went while it
    # started would otherwise train on as an orphan (training/base/launch.py, a light import).
    from training.base.launch import die_with_agent

    die_with_agent()

    from training.base.fast_exit import exit_now
    from training.loop.train import main

    exit_now(main())
