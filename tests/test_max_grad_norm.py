"""max_grad_norm=0 is no clipping on every engine, as DeepSpeed reads gradient_clipping=0: the one-process
and DDP step (training/loop/step.py apply) used to pass 0 to clip_grad_norm_, which scales every gradient
by 0, so the run stopped learning without a word. The DeepSpeed engine's side: tests/test_cudnn_shapes.py
trains with max_grad_norm=0 under ZeRO-2 and checks the weights moved."""

from types import SimpleNamespace

import pytest
import torch

from training.config.load import load_config
from training.config.schema import ConfigError


class Weights(torch.nn.Module):
    """The smallest student apply() can step: one weight, no tap of a last layer."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(4))
        self.last_layer = None


@pytest.fixture
def accelerator():
    """accelerate's Accelerator in this process (one CPU process, no process group); its shared state
    is reset afterwards for the next test of this worker."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.parametrize("max_grad_norm, scale", [(0.0, 1.0), (1.0, 0.2), (10.0, 1.0)])
def test_the_one_process_step_clips_to_max_grad_norm_and_zero_is_no_clipping(accelerator, max_grad_norm, scale):
    """apply() as the loop calls it (one process, the fused AdamW of training/step/optimizer.py): the
    optimizer steps on the gradient clipped to max_grad_norm (a norm of 5 to 1 at 1.0: scaled by 0.2),
    unchanged at 0 (no clipping), and the logged norm is the norm before clipping."""
    from training.loop.step import LocalResult, Window, apply
    from training.step.losses import StepLosses
    from training.step.optimizer import build_optimizer

    config = load_config("test", [f"max_grad_norm={max_grad_norm}", "weight_decay=0", "warmup_steps=0"], 1, check_paths=False)
    model = Weights()
    optimizer, scheduler = build_optimizer(config, model)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    seen = []
    optimizer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(model.weight.grad.clone()))
    gradient = torch.tensor([3.0, 4.0, 0.0, 0.0])  # norm 5
    losses = StepLosses(total=(model.weight * gradient).sum(), logged={})
    run = SimpleNamespace(accelerator=accelerator, config=config, model=model, seraena=None, optimizer=optimizer,
                          scheduler=scheduler, progress=SimpleNamespace(step=0, micro_step=1))
    logged, reason, _ = apply(run, LocalResult(losses=losses), Window(ends=True, ddp_accumulates=False))
    assert reason == "" and float(logged["grad_norm"]) == pytest.approx(5.0)
    assert torch.allclose(seen[0], gradient * scale)
    assert (model.weight.detach()[:2] < 0).all()  # the first AdamW step moves each weight against its gradient


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_negative_max_grad_norm_is_refused_and_zero_is_allowed(value):
    with pytest.raises(ConfigError, match=r"max_grad_norm=\S+ must be 0 \(no clipping\) or a positive gradient norm"):
        load_config("test", [f"max_grad_norm={value}"], 1, check_paths=False)
    assert load_config("test", ["max_grad_norm=0"], 1, check_paths=False).max_grad_norm == 0
