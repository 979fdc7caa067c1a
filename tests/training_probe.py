"""Runs training/taehv_train.py's main as one rank and reports, after the marker PROBE, two things
no CPU result shows (tests/test_training.py reads both from one run):

- "seeding": every call that reseeds a global generator (torch's CPU one, or CUDA's) after the
  per-rank seeding. On a GPU, torch.manual_seed also reseeds every CUDA device, so one such call
  gives every rank the same CUDA noise from then on.
- "reads": per micro-step (train_step), the calls that read a tensor's value on the host. On a GPU
  each waits for every kernel queued before it.
"""

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import accelerate.utils  # noqa: E402
import torch  # noqa: E402

import training.loop.train as loop  # noqa: E402

# --- seeding ---
per_rank_seeding_done = False
seeding_calls: list[str] = []
set_seed = accelerate.utils.set_seed


def recording_set_seed(seed, device_specific=False, **kwargs):
    global per_rank_seeding_done
    set_seed(seed, device_specific=device_specific, **kwargs)
    per_rank_seeding_done = per_rank_seeding_done or device_specific


def record(module, name: str) -> None:
    original = getattr(module, name)

    def recorded(*args, **kwargs):
        if per_rank_seeding_done:
            where = " < ".join(f"{frame.name} ({Path(frame.filename).name}:{frame.lineno})"
                               for frame in reversed(traceback.extract_stack()[:-1][-3:]))
            seeding_calls.append(f"{module.__name__}.{name} from {where}")
        return original(*args, **kwargs)

    setattr(module, name, recorded)


accelerate.utils.set_seed = recording_set_seed
for module in (torch, torch.random):
    for name in ("manual_seed", "seed"):
        record(module, name)
for name in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
    record(torch.cuda, name)

# --- device reads ---
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
print("PROBE " + json.dumps({"exit_code": code, "seeding": {"per_rank_seeding_done": per_rank_seeding_done, "calls": seeding_calls},
                             "reads": steps}))
