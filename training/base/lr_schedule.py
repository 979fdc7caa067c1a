"""Learning-rate schedules under the names (and with the shapes) of diffusers' `get_scheduler`, so
configs written for the original scripts keep their meaning; written here because importing
diffusers costs every rank ~3 s of start-up when no reference VAE is used."""

from __future__ import annotations

import math


def _warmup(step: int, warmup: int) -> float:
    return step / max(1, warmup)


def _constant(step: int, warmup: int, total: int) -> float:
    return 1.0


def _constant_with_warmup(step: int, warmup: int, total: int) -> float:
    return _warmup(step, warmup) if step < warmup else 1.0


def _linear(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def _cosine(step: int, warmup: int, total: int) -> float:
    """Half a cosine from the peak to 0 (diffusers' cosine, num_cycles=0.5)."""
    if step < warmup:
        return _warmup(step, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def _cosine_with_restarts(step: int, warmup: int, total: int) -> float:
    """diffusers' default of one cycle: the cosine above, then 0 from the last step on."""
    return 0.0 if step >= max(total, warmup + 1) else _cosine(step, warmup, total)


POLYNOMIAL_LR_END = 1e-7  # diffusers' default end value, in absolute learning rate


def _polynomial(step: int, warmup: int, total: int, lr: float) -> float:
    """Linear decay (power 1) from the peak to POLYNOMIAL_LR_END."""
    if step < warmup:
        return _warmup(step, warmup)
    if step > total:
        return POLYNOMIAL_LR_END / lr
    remaining = 1 - (step - warmup) / max(1, total - warmup)
    return ((lr - POLYNOMIAL_LR_END) * remaining + POLYNOMIAL_LR_END) / lr


FACTORS = {"constant": _constant, "constant_with_warmup": _constant_with_warmup, "linear": _linear, "cosine": _cosine,
           "cosine_with_restarts": _cosine_with_restarts}
SCHEDULES = (*FACTORS, "polynomial")


def build_lr_scheduler(optimizer, name: str, warmup_steps: int, total_steps: int):
    """A LambdaLR over `optimizer`: its state dict holds only the step, as diffusers' did."""
    from functools import partial

    from torch.optim.lr_scheduler import LambdaLR

    if name == "polynomial":
        factor = partial(_polynomial, warmup=warmup_steps, total=total_steps, lr=optimizer.defaults["lr"])
    else:
        factor = partial(FACTORS[name], warmup=warmup_steps, total=total_steps)
    return LambdaLR(optimizer, factor)
