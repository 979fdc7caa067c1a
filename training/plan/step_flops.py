"""FLOPs and bytes moved of one training micro-step at a config's shape, counted on the meta device:
nothing runs and nothing is allocated, so the h100 profile's 4 x 9 x 480x720 step is counted on a laptop.

Counted with torch.utils.flop_counter (convolutions and matmuls, forward and backward; elementwise
work is not counted, as in every MFU figure), with one change (count_flops): a convolution counts
only the products of its kernel with input values, not with the zero padding around them, which
torch's formula counts and which the kernels skip (oneDNN's on a CPU measurably: a 3x3 convolution
at 8x8, where 16% of the products are with padding, ran 16% faster than at 64x64 by torch's count,
and at the same rate without them). At 480x720 the padding is a fraction of a percent of the
student's work; at the 32x32 of the CPU benchmark, 11% of torch's count.
Part by part as the loop computes them:
- student: the encode and decodes its loss terms need (training/step/losses.py), forward and backward;
- lpips: forward on the judged decode and its backward to the decoded frames (weights frozen);
- seraena: the discriminator step (forward and backward) and the correction (a no-grad forward of
  the reals, a forward of the fakes and its backward to them), once per micro-step at most;
- reference: the reference VAE's encode (no grad), with the published architecture of its family
  (the diffusers class's default config); 0 with a latent cache or in autoencoder mode;
- optimizer: AdamW's step over the student's fp32 master weights (no FLOPs counted: elementwise),
  a window's step shared by its gradient_accumulation_steps micro-steps and, under ZeRO, by the ranks.

In the same pass, the bytes each op moves (ByteCounter): every aten op's tensor inputs and
outputs, eager (no fusion), views left out, each tensor at its dtype's size. The models are built
in the training dtype (bf16 for a bf16 profile, as DeepSpeed holds the student); what the loop
keeps in fp32 stays fp32 (the video and reference latents the losses compare against, the decoded
frames cast for the losses, LPIPS's input); a bf16 autocast (LPIPS with lpips_bf16, Seraena) is
counted as a module built in bf16 with its inputs cast (the meta device has no autocast). The
student is counted in NCHW whatever channels_last says: the meta device's convolutions return NCHW,
so each block would add a layout copy (50 GB at the h100 shape) that the GPU's kernels do not make.
The loss terms are one mean squared error per output the terms read. roofline.py turns FLOPs and
bytes into a time floor per part.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.flop_counter import conv_backward_flop as torch_conv_backward_flop
from torch.utils.flop_counter import conv_flop as torch_conv_flop

from models.taehv import TAEHV
from training.config.terms import needs_module, student_needs
from training.config.views import measured_geometry, student_of


def _valid_taps(size: int, kernel: int, stride: int, padding: int, dilation: int, out: int) -> int:
    """(output position, kernel tap) pairs of one spatial dimension that read an input value, not padding."""
    taps = 0
    for tap in range(kernel):
        offset = tap * dilation - padding  # output o reads input o * stride + offset, inside when 0 <= it < size
        first = max(0, -(offset // stride))  # ceil(-offset / stride)
        last = min(out - 1, (size - 1 - offset) // stride)
        taps += max(0, last - first + 1)
    return taps


def _conv_products(x_shape, w_shape, stride, padding, dilation, out_shape) -> int:
    """Multiply-adds of a (not transposed) convolution, padding left out."""
    products = x_shape[0] * w_shape[0] * w_shape[1]  # batch x out channels x in channels per group
    for size, kernel, step, pad, dil, out in zip(x_shape[2:], w_shape[2:], stride, padding, dilation, out_shape[2:]):
        products *= _valid_taps(size, kernel, step, pad, dil, out)
    return products


def _conv_flop(x_shape, w_shape, _bias, stride, padding, dilation, transposed, *args, out_shape=None, **kwargs) -> int:
    if transposed or isinstance(padding, str):
        # torch's formula is wrapped to take the output itself (out_val) and pass on its shape
        return torch_conv_flop(x_shape, w_shape, _bias, stride, padding, dilation, transposed, *args, out_val=out_shape,
                               **kwargs)
    return 2 * _conv_products(x_shape, w_shape, stride, padding, dilation, out_shape)


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, stride, padding, dilation, transposed, output_padding,
                        groups, output_mask, out_shape=None, **kwargs) -> int:
    """The input gradient and the weight gradient each take the forward's products once."""
    if transposed or isinstance(padding, str):
        return torch_conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, stride, padding, dilation, transposed,
                                        output_padding, groups, output_mask, out_val=out_shape, **kwargs)
    return 2 * _conv_products(x_shape, w_shape, stride, padding, dilation, grad_out_shape) * (
        int(bool(output_mask[0])) + int(bool(output_mask[1])))


_CONVOLUTIONS = (torch.ops.aten.convolution, torch.ops.aten._convolution, torch.ops.aten.cudnn_convolution,
                 torch.ops.aten._slow_conv2d_forward, torch.ops.aten.convolution_overrideable)


def flop_counter() -> FlopCounterMode:
    """torch's FlopCounterMode, convolutions counted without their padding (the module docstring);
    the benchmark counts its measured peak's convolution with it too."""
    mapping = {op: _conv_flop for op in _CONVOLUTIONS}
    mapping[torch.ops.aten.convolution_backward] = _conv_backward_flop
    return FlopCounterMode(display=False, custom_mapping=mapping)


def count_flops(fn) -> float:
    """FLOPs of running fn() (forward and any backward it runs), counted by flop_counter()."""
    with flop_counter() as counter:
        fn()
    return float(counter.get_total_flops())


# ops that move no bytes themselves: allocations, and _unsafe_view (a view its schema does not mark)
_NO_TRAFFIC = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided, torch.ops.aten.new_empty,
               torch.ops.aten.new_empty_strided, torch.ops.aten._unsafe_view}
# ops that write their mutated arguments without reading them
_WRITE_ONLY = {torch.ops.aten.copy_, torch.ops.aten.fill_, torch.ops.aten.zero_, torch.ops.aten.normal_,
               torch.ops.aten.uniform_, torch.ops.aten.bernoulli_, torch.ops.aten.random_}


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _nbytes(tensor: torch.Tensor) -> int:
    """What reading or writing `tensor` touches: its elements, or its storage where that is smaller
    (an expanded bias reads its few values once)."""
    return min(tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes())


def op_bytes(func, args, kwargs, out) -> int:
    """Bytes one aten op moves, eager: its tensor inputs read and outputs written (an in-place op's
    mutated arguments are written too); 0 for a view (an output its schema says aliases an input,
    not written), an allocation."""
    schema = func._schema
    if func.overloadpacket in _NO_TRAFFIC or any(r.alias_info is not None and not r.alias_info.is_write
                                                 for r in schema.returns):
        return 0
    given = {a.name: args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(schema.arguments)}
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    outputs = _tensors(out)
    written = outputs + [t for t in _tensors([given[name] for name in mutated]) if all(t is not o for o in outputs)]
    unread = {id(t) for name in mutated if func.overloadpacket in _WRITE_ONLY or name == "out" for t in _tensors(given[name])}
    return sum(_nbytes(t) for t in _tensors((args, kwargs)) if id(t) not in unread) + sum(_nbytes(t) for t in written)


class ByteCounter(TorchDispatchMode):
    """Bytes moved by every aten op run under it, by op name (op_bytes): what an unfused eager
    step reads and writes, the traffic a fusing compiler would remove in part."""

    def __init__(self):
        super().__init__()
        self.by_op: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        moved = op_bytes(func, args, kwargs or {}, out)
        if moved:
            self.by_op[func.overloadpacket.__name__] += moved
        return out


def count_costs(fn) -> dict:
    """{"flops", "bytes", "ops": {aten op: bytes}} of running fn(), in one pass."""
    with flop_counter() as flops, ByteCounter() as moved:
        fn()
    return {"flops": float(flops.get_total_flops()), "bytes": float(sum(moved.by_op.values())), "ops": dict(moved.by_op)}


def training_dtype(config) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.mixed_precision, torch.float32)


def _built(dtype: torch.dtype, make):
    """make() with its parameters created in `dtype` (a meta module's .to() would be a pass of its own)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make()
    finally:
        torch.set_default_dtype(default)


# what step_costs depends on beyond the config keys tagged measured=("flops") (training/config/schema.py)
COST_KEYS = ("mixed_precision", "lpips_bf16", "temporal_weight", "zero_stage", "num_processes",
             "gradient_accumulation_steps")


def step_costs(config) -> dict[str, dict]:
    """count_step_costs(config), kept in ~/.cache/taehv/step_costs.json by what it depends on (the
    keys and the counting and model code): the dry run, the benchmark and the docs count a shape once."""
    from models.measure_cache import REPO_ROOT, cached_measurement
    from training.config.schema import measured_keys
    from training.config.views import measured_values

    models = REPO_ROOT / "models"
    code = ["training/plan/step_flops.py", "training/config/terms.py", "training/config/views.py"] + [
        str(path.relative_to(REPO_ROOT)) for path in sorted([*models.glob("taehv*.py"), *models.glob("taehv/*.py")])] + [
        f"models/{name}.py" for name in ("variants", "metrics", "seraena", "reference_vae", "reference_families", "vae_geometry")]
    return cached_measurement("step_costs", measured_values(config, measured_keys("flops") + COST_KEYS), tuple(code),
                              lambda: count_step_costs(config))


def step_flops(config) -> dict[str, float]:
    """{part: FLOPs of one micro-step on one rank} for the parts above, and "total"."""
    return {part: cost["flops"] for part, cost in step_costs(config).items()}


def count_step_costs(config) -> dict[str, dict]:
    """{part: {"flops", "bytes", "ops"}} of one micro-step on one rank for the parts above, and "total"."""
    import torch.nn.functional as F

    batch, frames, height, width = config.batch_size_per_gpu, config.n_frames, config.height, config.width
    distill = config.use_ref_vae
    needs = student_needs(config)  # the outputs the terms on read (training/config/terms.py)
    dtype = training_dtype(config)
    parts: dict[str, dict] = {}
    with torch.device("meta"):
        taehv = _built(dtype, lambda: TAEHV(student_of(config))).train()  # NCHW (the module docstring)
        video = torch.rand(batch, frames, 3, height, width)  # fp32: the targets' copy, as the loop holds it
        with torch.no_grad():
            latent_shape = taehv.encode_video(video.to(dtype)).shape
        reference_latents = torch.randn(latent_shape)  # fp32, as the loop reads them

        def student_step():  # as training/step/losses.py: the student casts its inputs, each term reads fp32
            losses = []
            latents = taehv.encode_video(video.to(dtype)) if needs.encode else None
            if needs.latents:
                losses.append(F.mse_loss(latents.float(), reference_latents))
            decodes = ([taehv.decode_video(latents)] if needs.roundtrip else []) + (
                [taehv.decode_video(reference_latents.to(dtype))] if needs.reference_decode else [])
            for decoded in decodes:
                decoded = decoded.float()
                losses.append(F.mse_loss(decoded, video[:, : decoded.shape[1]]))
            sum(losses).backward()

        parts["student"] = count_costs(student_step)
        decoded_frames = taehv.decoded_frame_count(latent_shape[1])
        decoded = torch.rand(batch, decoded_frames, 3, height, width, requires_grad=True)  # fp32, as the terms read it
        autocast = dtype if dtype != torch.float32 else None  # Seraena's (and LPIPS's, lpips_bf16) bf16 autocast
        if needs_module(config, "lpips"):
            from models.metrics import LPIPS

            lpips_dtype = autocast if config.lpips_bf16 and autocast == torch.bfloat16 else torch.float32
            lpips = _built(lpips_dtype, LPIPS).requires_grad_(False)
            parts["lpips"] = count_costs(lambda: lpips(decoded.to(lpips_dtype), video[:, :decoded_frames].to(lpips_dtype))
                                      .float().mean().backward())
        if needs_module(config, "seraena"):
            parts["seraena"] = _seraena_costs(decoded, reference_latents, autocast or torch.float32)
        if distill and not config.latent_cache:
            parts["reference"] = _reference_costs(config, video, dtype)
        parts["optimizer"] = _optimizer_costs(config, taehv, dtype)
    parts["total"] = _sum(*parts.values())
    return parts


def _seraena_costs(decoded: torch.Tensor, latents: torch.Tensor, dtype: torch.dtype) -> dict:
    from models.seraena import SeraenaDiscriminator, group_frames, video_context

    groups = group_frames(decoded.detach())
    context = video_context(latents, groups.shape[0] // decoded.shape[0])
    disc = _built(dtype, lambda: SeraenaDiscriminator(groups.shape[1], latents.shape[2])).train()

    def discriminator_step():
        disc(groups.to(dtype), context.to(dtype)).float().pow(2).mean().backward()

    def correction():
        with torch.no_grad():
            real_scores = disc(groups.to(dtype), context.to(dtype)).float()
        offset = torch.zeros_like(groups, requires_grad=True)
        gap = (disc((groups + offset).to(dtype), context.to(dtype)).float() - real_scores).pow(2).mean()
        torch.autograd.grad(gap, [offset])

    return _sum(count_costs(discriminator_step), count_costs(correction))


def _reference_costs(config, video: torch.Tensor, dtype: torch.dtype) -> dict:
    from models.reference_vae import reference_architecture

    vae = _built(dtype, lambda: reference_architecture(config.reference_family, measured_geometry(config), config.ref_vae_path))
    with torch.no_grad():
        return count_costs(lambda: vae.encode(video.to(dtype).permute(0, 2, 1, 3, 4) * 2 - 1))


def _optimizer_costs(config, taehv: TAEHV, dtype: torch.dtype) -> dict:
    """AdamW (fused) over fp32 master weights; under a bf16 engine (DeepSpeed) the gradients are cast
    to fp32 first and the updated weights copied back into the bf16 module. Shared by the window's
    micro-steps and, under ZeRO, split over the ranks."""
    params = [p for p in taehv.parameters() if p.requires_grad]
    master = [torch.empty(p.shape) for p in params] if dtype != torch.float32 else [p.detach() for p in params]
    moments = [torch.empty(p.shape) for p in params for _ in range(2)]

    def step():
        grads = [torch.empty_like(p).float() for p in params]  # the engine's fp32 gradient partition
        torch._fused_adamw_(master, grads, moments[0::2], moments[1::2], [], [torch.zeros(()) for _ in params], lr=1e-4,
                            beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
        if dtype != torch.float32:
            for p, weight in zip(params, master):
                p.detach().copy_(weight)

    cost = count_costs(step)
    share = config.gradient_accumulation_steps * (config.num_processes if config.zero_stage > 0 else 1)
    return {"flops": cost["flops"] / share, "bytes": cost["bytes"] / share,
            "ops": {op: moved / share for op, moved in cost["ops"].items()}}


def _sum(*costs: dict) -> dict:
    ops = sum((Counter(c["ops"]) for c in costs), Counter())
    return {"flops": sum(c["flops"] for c in costs), "bytes": sum(c["bytes"] for c in costs), "ops": dict(ops)}
