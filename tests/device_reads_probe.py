"""Runs training/taehv_train.py's main as one rank and counts, per micro-step (train_step), the
calls that read a tensor's value on the host: on a GPU each waits for every kernel queued before
it. Used by tests/test_training.py::test_a_micro_step_reads_the_device_once."""

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import training.loop.train as loop  # noqa: E402

READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")
steps: list[list[str]] = []  # one list of reads per micro-step
inside = False


def counted(name: str):
    original = getattr(torch.Tensor, name)

    def read(self, *args, **kwargs):
        frame = traceback.extract_stack()[-2] if inside else None
        # torch.optim keeps Adam's step counters on the host unless fused or capturable: not a device read
        if inside and not (frame.name == "_get_value" and Path(frame.filename).parent.name == "optim"):
            steps[-1].append(f"Tensor.{name} at {Path(frame.filename).name}:{frame.lineno}")
        return original(self, *args, **kwargs)

    return read


for name in READS:
    setattr(torch.Tensor, name, counted(name))
train_step = loop.train_step


def counted_step(*args, **kwargs):
    global inside
    steps.append([])
    inside = True
    try:
        return train_step(*args, **kwargs)
    finally:
        inside = False


loop.train_step = counted_step
code = loop.main(sys.argv[1:])
print("READS " + json.dumps({"exit_code": code, "steps": steps}))
