"""bf16 convolutions on a CPU without bf16 instructions (models/cpu_bf16.py): computed in fp32 from
the bf16 values and rounded to bf16 as CUDA's kernels do, forward and backward, every other op and
every dtype a caller sees unchanged."""

import pytest
import torch
import torch.nn.functional as F

from models.cpu_bf16 import Bf16ConvolutionsInFp32, bf16_convolutions, cpu_has_fast_bf16


@pytest.mark.parametrize("conv, weight_shape", [
    (F.conv2d, (8, 4, 3, 3)), (F.conv3d, (8, 4, 2, 3, 3)), (lambda x, w: F.conv_transpose2d(x, w, stride=2), (4, 8, 4, 4)),
])
def test_a_bf16_convolution_is_the_fp32_one_of_the_same_values_rounded_to_bf16(conv, weight_shape):
    torch.manual_seed(0)
    spatial = (5, 9, 11)[: len(weight_shape) - 2]
    x = torch.randn(2, 4, *spatial).bfloat16().requires_grad_()
    w = torch.randn(*weight_shape).bfloat16().requires_grad_()
    with Bf16ConvolutionsInFp32():
        y = conv(x, w)
        y.backward(torch.ones_like(y))
    x32, w32 = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    y32 = conv(x32, w32)
    y32.backward(torch.ones_like(y32))
    assert y.dtype == x.grad.dtype == w.grad.dtype == torch.bfloat16  # what the caller sees stays bf16
    assert torch.equal(y, y32.bfloat16()) and torch.equal(x.grad, x32.grad.bfloat16()) and torch.equal(w.grad, w32.grad.bfloat16())
    native = conv(x.detach(), w.detach())  # PyTorch's own bf16 path agrees to bf16's precision
    assert torch.allclose(native.float(), y.float(), rtol=2e-2, atol=2e-2 * y.float().abs().max().item())


def test_other_ops_and_dtypes_pass_through_and_a_dtype_mix_is_still_refused():
    x, w = torch.randn(1, 2, 4, 4), torch.randn(3, 2, 3, 3)
    outside = F.conv2d(x, w)
    with Bf16ConvolutionsInFp32():
        assert torch.equal(F.conv2d(x, w), outside)  # fp32 untouched
        assert (x.bfloat16() * 2).dtype == torch.bfloat16
        with pytest.raises(RuntimeError):  # as CUDA refuses it: no silent cast of the fp32 weight
            F.conv2d(x.bfloat16(), w)


def test_it_applies_only_to_bf16_on_a_cpu_without_bf16_instructions():
    assert not isinstance(bf16_convolutions(torch.device("cpu"), torch.float32), Bf16ConvolutionsInFp32)
    assert not isinstance(bf16_convolutions(torch.device("cuda"), torch.bfloat16), Bf16ConvolutionsInFp32)
    assert isinstance(bf16_convolutions(torch.device("cpu"), torch.bfloat16), Bf16ConvolutionsInFp32) != cpu_has_fast_bf16()
