"""Runs training/taehv_train.py's main (one rank of an accelerate launch, or alone) with every
micro-step (train_step) under CUDA's dtype rules (tests/cuda_rules.py): a loss kernel fed two
dtypes raises as CUDA's would. Writes the ops it checked to rank<RANK>.json in the folder
CUDA_RULES_REPORTS names (one file per rank: two ranks printing at once interleave on a shared stdout).
Used by tests/test_cuda_rules.py."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_rules import CudaDtypeRules  # noqa: E402

import training.loop.train as loop  # noqa: E402

rules = CudaDtypeRules()
train_step = loop.train_step


def step_under_rules(*args, **kwargs):
    with rules:
        return train_step(*args, **kwargs)


loop.train_step = step_under_rules
code = loop.main(sys.argv[1:])
report = Path(os.environ["CUDA_RULES_REPORTS"]) / f"rank{os.environ.get('RANK', '0')}.json"
report.write_text(json.dumps({"exit_code": code, "checked": rules.checked}))
sys.exit(code)
