"""Runs training/taehv_train.py's main (one rank of an accelerate launch, or alone) with every
micro-step (train_step) under CUDA's dtype rules (tests/cuda_rules.py): a loss kernel fed two
dtypes raises as CUDA's would. Prints the ops it checked after CUDA_RULES. Used by
tests/test_cuda_rules.py."""

import json
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
print("CUDA_RULES " + json.dumps({"exit_code": code, "checked": rules.checked}), flush=True)
sys.exit(code)
