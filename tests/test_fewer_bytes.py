"""The student's blocks compute the published layout's numbers with fewer bytes moved (issue 39
item 3): FrameAndPastConv is a convolution of cat([x, past]) with past the frame before, and
UpsamplingConv a 3x3 convolution of the 2x nearest upsampling. Each is checked against that
definition (values and gradients), and the student's eager byte count at the h100 shape against
the same step run through the definitions."""

import pytest
import torch
import torch.nn.functional as F

from models.taehv.blocks import FrameAndPastConv, UpsamplingConv


def published_frame_and_past(layer: FrameAndPastConv, x, past=None, frames=None):
    """The published MemBlock's first convolution: the concatenation, past written out."""
    if past is None:
        past = torch.zeros_like(x)
        past.unflatten(0, (-1, frames))[:, 1:] = x.unflatten(0, (-1, frames))[:, :-1]
    return F.conv2d(torch.cat([x, past], 1), layer.weight, layer.bias, layer.stride, layer.padding)


def published_upsampling(layer: UpsamplingConv, x):
    """The published Upsample(scale_factor=2) then the 3x3 convolution."""
    return F.conv2d(F.interpolate(x, scale_factor=2, mode="nearest"), layer.weight, layer.bias, padding=1)


def values_and_gradients(fn, x, layer):
    x = x.detach().requires_grad_(True)
    layer.zero_grad()
    y = fn(x)
    y.backward(torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).sin())  # a gradient with no symmetry
    return y.detach(), x.grad, layer.weight.grad.clone()


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("kernel", [3, 1])  # MemBlock's 3x3, WideMemBlock's 1x1
def test_frame_and_past_conv_is_the_convolution_of_the_frame_beside_the_one_before(channels_last, kernel):
    torch.manual_seed(0)
    clips, frames, channels = 3, 5, 6
    layer = FrameAndPastConv(2 * channels, 4, kernel, padding=kernel // 2).double()
    x = torch.randn(clips * frames, channels, 7, 9, dtype=torch.float64)
    if channels_last:
        x, layer = x.contiguous(memory_format=torch.channels_last), layer.to(memory_format=torch.channels_last)
    ours = values_and_gradients(lambda v: layer(v, frames=frames), x, layer)
    published = values_and_gradients(lambda v: published_frame_and_past(layer, v, frames=frames), x, layer)
    for a, b in zip(ours, published):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    past = torch.randn_like(x)  # one frame at a time (streaming): any past
    torch.testing.assert_close(layer(x, past), published_frame_and_past(layer, x, past), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels_last", [False, True])
def test_upsampling_conv_is_the_convolution_of_the_upsampled_input(channels_last):
    torch.manual_seed(0)
    layer = UpsamplingConv(5, 4, 3, padding=1, bias=False).double()
    x = torch.randn(6, 5, 7, 9, dtype=torch.float64)
    if channels_last:
        x, layer = x.contiguous(memory_format=torch.channels_last), layer.to(memory_format=torch.channels_last)
    ours = values_and_gradients(layer, x, layer)
    published = values_and_gradients(lambda v: published_upsampling(layer, v), x, layer)
    for a, b in zip(ours, published):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if channels_last:
        assert layer(x).is_contiguous(memory_format=torch.channels_last)


def test_the_student_moves_at_least_15_percent_fewer_bytes_than_through_the_published_blocks(monkeypatch):
    """The eager count at the h100 shape (4 x 9 x 480x720, bf16, latents cached: encode and two
    decodes, forward and backward), as the dry run prints it, against the same step with the two
    convolutions run as the published layout runs them."""
    from training.config.load import load_config
    from training.plan.step_flops import count_step_costs

    config = load_config("h100", [], check_paths=False)
    config.latent_cache = "(latents in memory)"
    ours = count_step_costs(config)["student"]
    monkeypatch.setattr(FrameAndPastConv, "forward", published_frame_and_past)
    monkeypatch.setattr(UpsamplingConv, "forward", published_upsampling)
    published = count_step_costs(config)["student"]
    assert ours["bytes"] <= 0.85 * published["bytes"], (ours["bytes"] / 1e9, published["bytes"] / 1e9)
    assert ours["flops"] < published["flops"]  # 4 products per output pixel where the upsampled input took 9
    assert "upsample_nearest2d" not in ours["ops"] and ours["ops"]["cat"] < 0.02 * published["ops"]["cat"]  # the video padded to 12 frames


def autograd_node_names(*outputs) -> set[str]:
    seen, stack = set(), [out.grad_fn for out in outputs]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack += [parent for parent, _ in node.next_functions]
    return {node.name() for node in seen}


@pytest.mark.parametrize("variant", ["taew2_1", "taehv"])  # MemBlock and WideMemBlock decoders
def test_no_in_place_op_on_a_view_costs_the_students_backward_a_copy_of_an_activation(variant):
    """In channels_last (every GPU profile) FrameAndPastConv's output is a view of its 3D
    convolution's; an in-place ReLU on it made autograd rebuild the whole activation in the backward
    (AsStridedBackward: a zero fill and a copy; CopySlices: a clone and a copy), once per block.
    The same values and gradients as the in-place ReLU gave."""
    from models.taehv import TAEHV
    from models.taehv.blocks import MemBlock

    torch.manual_seed(0)
    model = TAEHV(variant).set_fast_path(channels_last=True).to(memory_format=torch.channels_last)  # fp32: the views of GPU dtypes
    latents = model.encode_video(torch.rand(2, 9, 3, 32, 32))
    names = autograd_node_names(latents, model.decode_video(latents))
    assert not {"AsStridedBackward0", "torch::autograd::CopySlices"} & names, names
    block = next(module for module in model.double().modules() if isinstance(module, MemBlock))
    x = torch.randn(10, block.conv[0].in_channels // 2, 6, 6, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    out_of_place = values_and_gradients(lambda v: block(v, frames=5), x, block.conv[0])
    block.conv[1].inplace = True
    in_place = values_and_gradients(lambda v: block(v, frames=5), x, block.conv[0])
    for a, b in zip(out_of_place, in_place):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("sets, nhwc", [([], True), (["accelerate_config=deepspeed_1gpu.yaml"], False)], ids=["one process", "ZeRO-2"])
def test_the_trainers_weights_take_the_activations_layout_so_no_gradient_is_copied_back(sets, nhwc):
    """In channels_last (the GPU profiles) without DeepSpeed the trainer's student holds its weights
    in NHWC: each gradient then arrives in its weight's layout and autograd keeps it as it is, where an
    NCHW weight had 49 of its gradients copied back each backward (and cuDNN converted each weight in
    every forward); UpsamplingConv sums its 4x4 kernel in the weight's own order, so its 3 gradients
    arrive in it too. Under DeepSpeed the weights stay NCHW: its engine views each parameter as bytes
    when it starts."""
    from training.config.load import load_config
    from training.loop.build import build_model

    config = load_config("1gpu_h100", ["height=32", "width=32", "n_frames=9", "pretrained_model_path=", *sets], 1, check_paths=False)
    student = build_model(config)
    weights = {name: p for name, p in student.named_parameters() if p.dim() == 4}
    layout = torch.channels_last if nhwc else torch.contiguous_format  # (a 1x1 kernel is both)
    assert all(p.is_contiguous(memory_format=layout) for p in weights.values())
    if not nhwc:
        assert not all(p.is_contiguous(memory_format=torch.channels_last) for p in weights.values())

    def strides(tensor):  # those that set the layout: a dim of size 1 has any stride
        return [stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 1]

    copied = []
    for name, weight in weights.items():
        weight.register_hook(lambda grad, name=name, weight=weight: copied.append(name) if strides(grad) != strides(weight) else None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = student(torch.rand(1, 9, 3, 32, 32), torch.randn(1, 3, student.taehv.latent_channels, 4, 4), True, False, True)
    sum(output.float().square().mean() for output in outputs.values()).backward()
    if nhwc:
        assert copied == [], copied
    else:  # the others' gradients come back NHWC, from convolutions of NHWC activations; UpsamplingConv's in its weight's
        upsampling = [name for name in weights if isinstance(student.get_submodule(name.removesuffix(".weight")), UpsamplingConv)]
        assert len(upsampling) == 3 and not set(upsampling) & set(copied) and len(copied) > 40, copied


def test_moments_saved_in_nchw_are_resumed_in_their_nhwc_weights_layout():
    """A checkpoint of NCHW weights (DeepSpeed, or before the one-GPU weights went NHWC) resumed into
    NHWC weights: its moments load as saved, and the fused AdamW walks them in the weight's memory
    order, which mixes elements (checked here first); state_in_parameter_layout gives the step of
    the same weights held in NCHW."""
    from training.step.optimizer import state_in_parameter_layout

    torch.manual_seed(0)
    start, gradient, exp_avg, exp_avg_sq = torch.randn(4, 6, 3, 3), torch.randn(4, 6, 3, 3), torch.randn(4, 6, 3, 3), torch.rand(4, 6, 3, 3)

    def stepped(layout, align):
        weight = torch.nn.Parameter(start.clone(memory_format=layout))
        optimizer = torch.optim.AdamW([weight], lr=0.1, fused=True)
        weight.grad = gradient.contiguous(memory_format=layout)
        optimizer.state[weight] = {"step": torch.tensor(3.0), "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
        if align:
            state_in_parameter_layout(optimizer)
        optimizer.step()
        return weight.detach()

    expected = stepped(torch.contiguous_format, align=False)
    assert not torch.allclose(stepped(torch.channels_last, align=False), expected)
    assert torch.equal(stepped(torch.channels_last, align=True), expected)
