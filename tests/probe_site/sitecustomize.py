"""On PYTHONPATH in tests only: with TAEHV_STEP_PROBE set, the training process
(training/taehv_train.py, started by the launcher through accelerate launch) runs with
tests/step_probe.py installed. Every other Python process is left alone."""

import os
import sys
from pathlib import Path

if os.environ.get("TAEHV_STEP_PROBE") and sys.argv and sys.argv[0].endswith("taehv_train.py"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import step_probe

    step_probe.install(os.environ["TAEHV_STEP_PROBE"])
