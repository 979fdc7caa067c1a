"""TAEHV training entry point, started by the launchers through `accelerate launch`:

    accelerate launch --config_file accelerate_configs/ddp_cpu.yaml --num_processes 2 \
        training/taehv_train.py --config test --output-dir output/run1 [--set key=value] [--resume latest]

The loop itself is training/loop/train.py; docs/architecture.md draws the layers.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file by accelerate launch: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.base.fast_exit import exit_now  # noqa: E402
from training.loop.train import main  # noqa: E402

if __name__ == "__main__":
    exit_now(main())
