"""CUDA's dtype rules, enforced on the CPU. CUDA's loss kernels (and their backwards) and its
index_put/scatter refuse floating tensors of two dtypes that the CPU's kernels accept: the first
H100 run stopped at its first backward on `mse_loss(fp32 prediction, bf16 target)`, which every
CPU test had passed (../shared/reference/gpu-h100-2026-11.md). Under `CudaDtypeRules()` such a
call raises on the CPU too, naming the op and the dtypes. 0-dim tensors are exempt (CUDA takes a
scalar of another dtype)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# the overload packets whose CUDA kernels need every floating (non-scalar) tensor in one dtype
ONE_DTYPE_OPS = {
    aten.mse_loss, aten.mse_loss_backward,
    aten.smooth_l1_loss, aten.smooth_l1_loss_backward,
    aten.huber_loss, aten.huber_loss_backward,
    aten.binary_cross_entropy, aten.binary_cross_entropy_backward,
    aten.index_put, aten.index_put_, aten._index_put_impl_,
    aten.scatter, aten.scatter_, aten.scatter_add, aten.scatter_add_, aten.scatter_reduce, aten.scatter_reduce_,
}


def floating_tensors(values) -> list[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, (list, tuple)):
            found += floating_tensors(value)
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
            found.append(value)
    return found


class CudaDtypeRules(TorchDispatchMode):
    """Raises TypeError when an op of ONE_DTYPE_OPS gets floating tensors of two dtypes; counts the
    checked calls by op name (`checked`), so a test can show the rule ran where it matters."""

    def __init__(self):
        super().__init__()
        self.checked: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in ONE_DTYPE_OPS:
            name = func.overloadpacket.__name__
            self.checked[name] = self.checked.get(name, 0) + 1
            dtypes = {t.dtype for t in floating_tensors([*args, *kwargs.values()])}
            if len(dtypes) > 1:
                raise TypeError(f"{name} got floating tensors of {sorted(str(d) for d in dtypes)}: CUDA's kernel "
                                "refuses two dtypes (cast one side where it is made)")
        return func(*args, **kwargs)


