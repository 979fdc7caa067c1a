"""Run by tests/test_cudnn_shapes.py as one rank under accelerate launch: training/taehv_train.py's
main, with every convolution the whole run meets recorded (its training, validation, the starting
weights' baseline and the export; a forward, an input gradient and a weight gradient are what cuDNN
tunes one by one, each shape at its first use while cudnn.benchmark is on). Prints, after the marker
SHAPES, the exit code and the convolutions first met after the first optimizer step: on a GPU each
would be timed then, mid-run."""

import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training.loop.train as loop  # noqa: E402

aten = torch.ops.aten


class FirstUses(TorchDispatchMode):
    """Each convolution's kind, shapes, dtypes and layout at its first use; late: after the run's first
    optimizer step ended (Progress.step >= 1), while cudnn.benchmark is on."""

    def __init__(self):
        super().__init__()
        self.run = None
        self.seen: set = set()
        self.late: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (aten.convolution.default, aten.convolution_backward.default):
            if func is aten.convolution.default:
                kinds, data, weight = ["forward"], args[0], args[1]
            else:  # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask)
                data, weight = args[1], args[2]
                kinds = [kind for kind, wanted in zip(("input gradient", "weight gradient"), args[10]) if wanted]
            for kind in kinds:
                key = (kind, tuple(data.shape), str(data.dtype), tuple(weight.shape), str(weight.dtype),
                       data.is_contiguous(memory_format=torch.channels_last))
                if key not in self.seen:
                    self.seen.add(key)
                    step = self.run.progress.step if self.run is not None else 0
                    if step >= 1 and torch.backends.cudnn.benchmark:
                        self.late.append(f"after step {step}: {key}")
        return func(*args, **(kwargs or {}))


shapes = FirstUses()
train, finish = loop.train, loop.finish


def recorded(phase):
    def run_phase(run):
        shapes.run = run
        with shapes:
            return phase(run)

    return run_phase


loop.train, loop.finish = recorded(train), recorded(finish)
code = loop.main(sys.argv[1:])
print("SHAPES " + json.dumps({"exit_code": code, "late": shapes.late, "seen": len(shapes.seen)}), flush=True)
