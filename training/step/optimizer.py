"""The optimizer and DeepSpeed's settings for it (data types, bucket sizes), shared by the loop and the
memory estimate."""

from __future__ import annotations

import torch

from models.taehv import TAEHV
from training.base.lr_schedule import build_lr_scheduler
from training.config.schema import TrainConfig
from training.config.views import student_of


def deepspeed_data_types(config: TrainConfig) -> dict:
    """bf16 engines sum each rank's gradients over the accumulation window in fp32: in bf16 (8 bits
    of mantissa) a window of many micro-steps (1gpu_h100: 32) loses the small contributions. It
    costs one fp32 copy of this rank's gradient partition. The exchange that feeds it is fp32 too
    (communication_data_type; DeepSpeed's default is the engine's bf16): ZeRO-2 reduces every
    micro-step's gradients across ranks, and a bf16 sum of the ranks' gradients would round each
    micro-step's contribution to 8 bits before the fp32 accumulation sees it. DeepSpeed casts the
    bf16 bucket to fp32 for the collective and adds the fp32 result into the fp32 partition; it
    costs twice the bytes on the wire (4 per parameter per micro-step: 44 MB for an 11 M-parameter
    student, next to a step of hundreds of milliseconds)."""
    if config.mixed_precision != "bf16":
        return {}
    return {"data_types": {"grad_accum_dtype": "fp32"}, "communication_data_type": "fp32"}


DEEPSPEED_DEFAULT_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's reduce_bucket_size and allgather_bucket_size (5e8)


def student_parameter_count(config: TrainConfig) -> int:
    """Parameters of the student the config builds, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in TAEHV(student_of(config)).parameters())


def deepspeed_zero_settings(config: TrainConfig, params: int) -> dict:
    """The zero_optimization keys for a student of `params` parameters (training/plan/memory.py counts
    the bytes they allocate). DeepSpeed's 5e8-element buckets are sized for billion-parameter
    models: ZeRO-1/2 allocate a reduce bucket of reduce_bucket_size elements at each backward (1 GB
    in bf16, for an 11 M-parameter student) and ZeRO-3 keeps one for the whole run. Here it holds
    the whole student: every gradient still fits in one bucket, so DeepSpeed still reduces once,
    at the end of each backward, as with 5e8, but the bucket is the student's size (22 MB in bf16
    for taecvx). allgather_bucket_size allocates nothing (the gather writes into the flat bf16
    weights); it gets the same size so a gather without all_gather_into_tensor is one piece too.
    overlap_comm is pinned to DeepSpeed's own default (on for ZeRO-3 only): with it, ZeRO-1/2
    allocate a second bucket, and the memory estimate must not depend on a default changing."""
    elements = min(DEEPSPEED_DEFAULT_BUCKET_ELEMENTS, params + params % 2)  # all-gather sizes are even (4-byte aligned)
    return {"reduce_bucket_size": elements, "allgather_bucket_size": elements, "overlap_comm": config.zero_stage == 3}


def build_optimizer(config: TrainConfig, model):
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],  # frozen parts: no optimizer state
        lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2), weight_decay=config.weight_decay,
        # fused on every device: one kernel per step on a GPU, and its found_inf lets a non-finite gradient
        # skip the update on the device without a host read (training/loop/step.py apply; DeepSpeed's own
        # overflow check does this under ZeRO)
        fused=True,
    )
    return optimizer, build_lr_scheduler(optimizer, config.lr_scheduler, config.warmup_steps, config.max_steps)


def state_in_parameter_layout(optimizer) -> None:
    """Each AdamW moment in its parameter's memory layout, after a resume. A checkpoint written with
    NCHW weights (by DeepSpeed, or before the one-GPU weights went NHWC) loads its moments as saved,
    and the fused AdamW walks a moment's memory in its parameter's order: a layout apart, it would
    mix elements. (Under DeepSpeed the state is flat: nothing to do.)"""
    for param, state in getattr(optimizer, "optimizer", optimizer).state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == param.shape and value.stride() != param.stride():
                state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def set_peak_learning_rate(scheduler, learning_rate: float) -> None:
    """After a resume: the schedule goes on at its step with `learning_rate` as its peak (a resume may
    lower it: the fix for a loss that went non-finite). The scheduler's saved state holds the peak it
    was built with; its factor at the current step is unchanged."""
    scheduler.base_lrs = [learning_rate for _ in scheduler.base_lrs]
    rates = [learning_rate * factor(scheduler.last_epoch) for factor in scheduler.lr_lambdas]
    for group, rate in zip(scheduler.optimizer.param_groups, rates):
        group["initial_lr"], group["lr"] = learning_rate, rate
    scheduler._last_lr = rates
