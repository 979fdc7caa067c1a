"""A probe inside a real training process (one rank of an accelerate launch, or alone): what no
CPU result shows by itself, checked in every micro-step (train_step) of the whole run. Installed
by tests/probe_site/sitecustomize.py when TAEHV_STEP_PROBE names a folder, so a test launches the
product's own command (the launcher, accelerate, training/taehv_train.py) with the probe inside.
Each rank writes rank<RANK>.json there when its main returns:

- "checked": CUDA's dtype rules (tests/cuda_rules.py) held over every micro-step, by op.
- "late_convolutions": convolution shapes (forward, input gradient, weight gradient: what cuDNN
  tunes one by one) first met after the process's first optimizer step while cudnn.benchmark was on.
  On a GPU each would be timed then, mid-run, with that step's activations live.
- "adaptive": per adaptive-weight measurement, [the loop's weight, the same weight by plain fp32
  autograd through a copy of the whole decoder on the same weights and latents].
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_rules import CudaDtypeRules  # noqa: E402

aten = torch.ops.aten


class ConvolutionShapes(TorchDispatchMode):
    """Each convolution kind and shape cuDNN would tune; those first met after the process's first
    optimizer step (its micro-steps: the discriminator updates in a window's last one) are late."""

    def __init__(self):
        super().__init__()
        self.micro_step = 0
        self.step = self.first_step = None  # the optimizer step of the micro-step running, of the first one
        self.paused = False
        self.late: list[str] = []
        self.seen: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused and func in (aten.convolution.default, aten.convolution_backward.default):
            if func is aten.convolution.default:
                kinds = ["forward"]
                data, weight = args[0], args[1]
            else:  # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask)
                data, weight, mask = args[1], args[2], args[10]
                kinds = [kind for kind, wanted in zip(("input gradient", "weight gradient"), mask) if wanted]
            for kind in kinds:
                key = (kind, tuple(data.shape), str(data.dtype), tuple(weight.shape), str(weight.dtype),
                       data.is_contiguous(memory_format=torch.channels_last))
                if key not in self.seen:
                    self.seen.add(key)
                    if self.step != self.first_step and torch.backends.cudnn.benchmark:
                        self.late.append(f"step {self.step} (micro-step {self.micro_step}): {key}")
        return func(*args, **kwargs)


def reference_adaptive_weight(taehv, decoded: dict, reconstruction, adversarial, outputs: dict, clamp: float) -> float:
    """VQGAN's adaptive weight by plain autograd in fp32: a fresh fp32 copy of the student (the
    weights the forward used) decodes the same latents, and d loss / d W of its last convolution
    comes from autograd.grad with respect to that weight itself."""
    from models.taehv import TAEHV
    from training.step.losses import decoder_last_conv

    copy = TAEHV(taehv.args)
    copy.load_state_dict({name: value.detach().float() for name, value in taehv.state_dict().items()})
    weight = decoder_last_conv(copy).weight
    norms = []
    for loss in (reconstruction, adversarial):
        names = [name for name in decoded if name in outputs]
        gradients = torch.autograd.grad(loss, [outputs[name] for name in names], retain_graph=True, allow_unused=True)
        total = torch.zeros_like(weight)
        for name, gradient in zip(names, gradients):
            if gradient is not None:
                with torch.enable_grad():
                    frames = copy.decode_video(decoded[name].float())
                    total += torch.autograd.grad(frames, weight, gradient.float())[0]
        norms.append(total.norm())
    return float((norms[0] / (norms[1] + 1e-4)).clamp(0.0, clamp))


def install(reports: str) -> None:
    import training.loop.train as loop
    import training.step.losses as losses

    rules, shapes = CudaDtypeRules(), ConvolutionShapes()
    adaptive: list[list[float]] = []
    decoded: dict = {}  # output name -> the latents the tap's last decode of that name read
    train_step, main, tap_decode, adaptive_weight = loop.train_step, loop.main, losses.LastLayerTap.decode, losses.adaptive_weight

    def step_under_probe(run, *args, **kwargs):
        shapes.step = run.progress.step
        shapes.first_step = shapes.step if shapes.first_step is None else shapes.first_step
        try:
            with rules, shapes:
                return train_step(run, *args, **kwargs)
        finally:
            shapes.micro_step += 1

    def recorded_decode(self, name, latents):
        decoded[name] = latents.detach()
        return tap_decode(self, name, latents)

    def checked_adaptive_weight(reconstruction, adversarial, last_layer, outputs, clamp):
        shapes.paused = True  # the check's own fp32 decode is not the run's
        try:
            reference = reference_adaptive_weight(last_layer.taehv, decoded, reconstruction, adversarial, outputs, clamp)
        finally:
            shapes.paused = False
        weight = adaptive_weight(reconstruction, adversarial, last_layer, outputs, clamp)
        adaptive.append([float(weight), reference])
        return weight

    def main_then_report(argv=None):
        code = main(argv)
        report = Path(reports) / f"rank{os.environ.get('RANK', '0')}.json"
        report.write_text(json.dumps({"exit_code": code, "checked": rules.checked, "late_convolutions": shapes.late,
                                      "micro_steps": shapes.micro_step, "adaptive": adaptive}))
        return code

    loop.train_step, loop.main = step_under_probe, main_then_report
    losses.LastLayerTap.decode, losses.adaptive_weight = recorded_decode, checked_adaptive_weight
