"""The module inside what accelerate wrapped it in (DDP, a DeepSpeed engine)."""

from __future__ import annotations

import torch


def unwrap(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """accelerator.unwrap_model(model), without the DeepSpeed import it makes whenever DeepSpeed is
    installed, only to rule its engine out: 0.5 CPU-s at the start of every DDP rank."""
    if accelerator.state.deepspeed_plugin is not None:
        return accelerator.unwrap_model(model)
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
