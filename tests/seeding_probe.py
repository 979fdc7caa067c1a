"""Runs training/taehv_train.py's main as one rank and prints every call that reseeds a global
generator (torch's CPU one, or CUDA's) after the per-rank seeding: on a GPU, torch.manual_seed also
reseeds every CUDA device, so one such call gives every rank the same CUDA noise from then on.
Used by tests/test_training.py::test_nothing_reseeds_a_global_generator_after_the_per_rank_seeding."""

import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import accelerate.utils  # noqa: E402
import torch  # noqa: E402

per_rank_seeding_done = False
calls: list[str] = []
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
            calls.append(f"{module.__name__}.{name} from {where}")
        return original(*args, **kwargs)

    setattr(module, name, recorded)


accelerate.utils.set_seed = recording_set_seed
for module in (torch, torch.random):
    for name in ("manual_seed", "seed"):
        record(module, name)
for name in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
    record(torch.cuda, name)

from training.loop.train import main  # noqa: E402

code = main(sys.argv[1:])
print("SEEDING " + json.dumps({"exit_code": code, "per_rank_seeding_done": per_rank_seeding_done, "calls": calls}))
