"""The student's weights as one state dict, whatever holds them (DDP, ZeRO-2/3 partitions), and their
fingerprint."""

from __future__ import annotations

import hashlib

import torch

from training.base.unwrap import unwrap


def master_weights(accelerator, model) -> dict:
    """The student's weights as the optimizer holds them, fp32, on the training device, on every
    rank: under DeepSpeed its fp32 master copies (ZeRO partitions gathered: a collective), not the
    bf16 copies the forward runs with; otherwise the parameters themselves. Buffers as they are."""
    student = unwrap(accelerator, model)
    taehv = student.taehv
    weights = {name: buffer.detach().float() for name, buffer in taehv.named_buffers()}
    trained = [(name, param) for name, param in taehv.named_parameters() if name not in student.frozen_weights]
    if accelerator.state.deepspeed_plugin is not None:
        from deepspeed.utils import safe_get_full_fp32_param

        weights.update({name: safe_get_full_fp32_param(param).detach().float() for name, param in trained})
    else:
        weights.update({name: param.detach().float() for name, param in trained})
    # frozen parts (train_encoder/train_decoder=false): their starting fp32 values, unchanged
    weights.update({name: value.to(accelerator.device) for name, value in student.frozen_weights.items()})
    return weights


def live_weights(accelerator, model) -> dict | None:
    """What master_weights reads, as tensors that follow the training, where there are such: without
    DeepSpeed, the fp32 parameters themselves (not views: a parameter whose data is replaced is still
    read right) and the frozen weights' fp32 values on the device (constant). None otherwise."""
    if accelerator.state.deepspeed_plugin is not None:
        return None
    student = unwrap(accelerator, model)
    trained = {name: param for name, param in student.taehv.named_parameters() if name not in student.frozen_weights}
    if any(True for _ in student.taehv.buffers()) or any(param.dtype != torch.float32 for param in trained.values()):
        return None
    return {**trained, **{name: value.to(accelerator.device) for name, value in student.frozen_weights.items()}}


def full_state_dict(accelerator, model) -> dict:
    """master_weights as CPU copies, in the module's key order (what exports and fingerprints use)."""
    weights = master_weights(accelerator, model)
    order = unwrap(accelerator, model).taehv.state_dict().keys()
    return {k: weights[k].cpu().clone() for k in order if k in weights}


def weights_fingerprint(state_dict: dict) -> str:
    """sha256 of the weights (ranks of one job must agree)."""
    digest = hashlib.sha256()
    for key in sorted(state_dict):
        digest.update(key.encode())
        digest.update(state_dict[key].numpy().tobytes())
    return digest.hexdigest()[:16]
