"""bf16 convolutions on a CPU without bf16 instructions. There PyTorch runs them through its naive
im2col path (the oneDNN kernels need AVX-512 or AMX for bf16): a bf16 training step of the test
profile took 9.3 s against 0.9 s in fp32 on a 2-core AVX2 machine. CUDA's bf16 convolutions read
bf16, accumulate in fp32 and write bf16; this computes each one the same way, through the fp32
kernels: the same bf16 values in, fp32 arithmetic, bf16 out. Every other op, and every dtype a
caller sees, is unchanged (so CUDA's dtype rules on the loss kernels hold as before)."""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


def _float(value):
    return value.float() if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 else value


def _bf16(value):
    return value.bfloat16() if isinstance(value, torch.Tensor) and value.dtype == torch.float32 else value


def _all_bf16_on_cpu(args) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in tensors)


class Bf16ConvolutionsInFp32(TorchDispatchMode):
    """Within it, a convolution (forward or backward) whose tensors are all bf16 on the CPU runs in
    fp32 and returns bf16. A mix of dtypes goes to PyTorch's own kernel, which refuses it as CUDA's does."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in CONVOLUTIONS and _all_bf16_on_cpu(args):
            return tree_map(_bf16, func(*tree_map(_float, args), **kwargs))
        return func(*args, **kwargs)


def cpu_has_fast_bf16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def convolutions_in_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a step in `dtype` on `device` computes its convolutions in fp32 (Bf16ConvolutionsInFp32)."""
    return device.type == "cpu" and dtype == torch.bfloat16 and not cpu_has_fast_bf16()


def bf16_convolutions(device: torch.device, dtype: torch.dtype):
    """The context a step in `dtype` on `device` runs in: fp32-accumulated convolutions on a CPU
    without bf16 instructions, nothing elsewhere."""
    return Bf16ConvolutionsInFp32() if convolutions_in_fp32(device, dtype) else contextlib.nullcontext()
