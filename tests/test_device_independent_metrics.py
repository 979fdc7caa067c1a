"""The metrics and the reference latent space give the same numbers on a GPU as on the CPU.

A GPU rounds in two places the CPU does not: cuDNN / cuBLAS run fp32 convolutions and matmuls in
TF32 (inputs rounded to a 10-bit mantissa, fp32 accumulation) wherever torch's flags allow it, as
training sets them; and a VAE loaded with torch_dtype=bf16 (the GPU default) has its buffers cast
to bf16. Both are reproduced here on the CPU: TF32 by a dispatch mode that rounds the operands of
those kernels, bf16 by loading the real diffusers classes in bf16 (from_pretrained casts on any
device)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from models.evaluation import SourceWarps, clip_metrics
from models.metrics import ssim
from models.reference_vae import latent_space_transform, load_reference_vae, tiny_reference_vae, vae_class

aten = torch.ops.aten
# the kernels TF32 applies to, and which of their arguments it rounds (not a bias or an added matrix)
TF32_OPERANDS = {aten.convolution.default: (0, 1), aten.mm.default: (0, 1), aten.bmm.default: (0, 1),
                 aten.addmm.default: (1, 2), aten.baddbmm.default: (1, 2)}


def tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to TF32's 10-bit mantissa (to nearest, ties to even), kept in fp32."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)


def tf32_allowed(op) -> bool:
    """What cuDNN (convolutions) and cuBLAS (matmuls) read: the operation's own fp32_precision,
    else its backend's, else torch's ("none" all the way up is full fp32)."""
    backends = torch.backends
    levels = ((backends.cudnn.conv, backends.cudnn, backends) if op is aten.convolution.default
              else (backends.cuda.matmul, backends))
    setting = next((level.fp32_precision for level in levels if level.fp32_precision != "none"), "ieee")
    return setting == "tf32"


class SimulatedTF32(TorchDispatchMode):
    """fp32 convolutions and matmuls as an Ampere-or-newer GPU runs them: where the flags allow TF32
    (honour_flags), or always (a device that does not honour a request for full fp32)."""

    def __init__(self, honour_flags: bool):
        super().__init__()
        self.honour_flags, self.rounded = honour_flags, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        operands = TF32_OPERANDS.get(func, ())
        if operands and (not self.honour_flags or tf32_allowed(func)):
            args = tuple(tf32(a) if i in operands and a.dtype == torch.float32 else a for i, a in enumerate(args))
            self.rounded += 1
        return func(*args, **(kwargs or {}))


def scene(seed: int, low: float, noise: float, cell: int = 4, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """(reconstruction, source), 1 x 3 x 3 x size x size: smooth bicubic detail in [low, 1] (bright,
    low contrast: the case where E[x^2] - E[x]^2 cancels most) and the source plus Gaussian noise."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(3, 3, size // cell, size // cell, generator=generator)
    source = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False).clamp(0, 1)
    source = (low + (1 - low) * source).unsqueeze(0)
    return (source + noise * torch.randn(source.shape, generator=generator)).clamp(0, 1), source


SCENES = {"0.96": (5, 0.7, 0.015), "0.81": (0, 0.8, 0.02, 8), "0.71": (2, 0.6, 0.06)}  # by their SSIM


def ssim_fp64(prediction: torch.Tensor, target: torch.Tensor) -> float:
    """The textbook formula (11-tap Gaussian, sigma 1.5) in fp64: the value every device should give."""
    x, y = prediction.flatten(0, 1).double(), target.flatten(0, 1).double()
    g = torch.exp(-(torch.arange(11, dtype=torch.float64) - 5).pow(2) / (2 * 1.5**2))
    window = ((g / g.sum())[:, None] * (g / g.sum())[None, :]).expand(3, 1, 11, 11)

    def blur(t):
        return F.conv2d(t, window, groups=3)

    mu_x, mu_y = blur(x), blur(y)
    var_x, var_y, cov = blur(x * x) - mu_x**2, blur(y * y) - mu_y**2, blur(x * y) - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    return (((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))).mean().item()


@pytest.mark.parametrize("name", SCENES)
def test_ssim_with_its_convolutions_rounded_to_tf32_agrees_with_fp64(name):
    """Even where TF32 is used despite the request for fp32: the textbook formula in fp32 moves by
    more than 1e-3 (what best_metric=ssim would pick by), ssim by less."""
    prediction, target = scene(*SCENES[name])
    exact = ssim_fp64(prediction, target)
    assert abs(ssim(prediction, target).item() - exact) < 1e-4  # fp32 without rounding
    x, y = prediction.flatten(0, 1), target.flatten(0, 1)
    g = torch.exp(-(torch.arange(11.0) - 5).pow(2) / 4.5)
    window = ((g / g.sum())[:, None] * (g / g.sum())[None, :]).expand(3, 1, 11, 11).contiguous()
    with SimulatedTF32(honour_flags=False) as mode:
        mu_x, mu_y = F.conv2d(x, window, groups=3), F.conv2d(y, window, groups=3)
        var_x, var_y = F.conv2d(x * x, window, groups=3) - mu_x**2, F.conv2d(y * y, window, groups=3) - mu_y**2
        cov = F.conv2d(x * y, window, groups=3) - mu_x * mu_y
        textbook = (((2 * mu_x * mu_y + 1e-4) * (2 * cov + 9e-4)) / ((mu_x**2 + mu_y**2 + 1e-4) * (var_x + var_y + 9e-4))).mean().item()
        rounded = ssim(prediction, target).item()
    assert mode.rounded >= 10
    assert abs(textbook - exact) > 1e-3  # the simulation bites: the GPU's error the issue measured
    assert abs(rounded - exact) < 1e-3, f"SSIM {rounded:.5f} with TF32 rounding against {exact:.5f} in fp64"


@pytest.fixture
def training_tf32_flags():
    """TF32 allowed, as training sets it (training/loop/build.py configure_cuda, the legacy flags)."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_ssim_asks_for_full_fp32_convolutions_and_restores_the_flags(training_tf32_flags):
    """With training's flags, a GPU that honours torch's flags gives SSIM exactly its fp32 value;
    the flags are as they were afterwards."""
    prediction, target = scene(*SCENES["0.81"])
    fp32 = ssim(prediction, target).item()
    with SimulatedTF32(honour_flags=True) as mode:
        on_a_gpu = ssim(prediction, target).item()
        outside = F.conv2d(target[0], torch.ones(3, 1, 3, 3) / 9, groups=3)  # other convolutions keep TF32
    assert mode.rounded == 1 and not torch.equal(outside, F.conv2d(target[0], torch.ones(3, 1, 3, 3) / 9, groups=3))
    assert on_a_gpu == pytest.approx(fp32, abs=1e-6)
    assert torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.conv.fp32_precision == "tf32"


def test_every_clip_metric_agrees_within_1e_3_under_tf32_rounding():
    """Each number inference.py reports for a clip (all but LPIPS, a network) with every fp32
    convolution and matmul rounded to TF32, against the same without rounding."""
    prediction, target = scene(*SCENES["0.81"])
    warps = SourceWarps(target)
    exact = clip_metrics(prediction, target, warps=warps)
    with SimulatedTF32(honour_flags=False):
        rounded = clip_metrics(prediction, target, warps=warps)
    assert exact.keys() == rounded.keys() and exact["flicker"] is not None
    for key, value in exact.items():
        if value is not None:
            assert rounded[key] == pytest.approx(value, abs=1e-3), key


@pytest.mark.parametrize("family", ["ltx", "ltx2"])
def test_latent_statistics_stay_fp32_when_the_vae_loads_in_bf16(family, tmp_path):
    """LTX and LTX-2 keep latents_mean/std as buffers; a bf16 load (the GPU default) casts them. The
    reference's shift and scale (its latent space, and latent_space_check's reading of it) are the
    fp32 ones, and the weights are the ones diffusers' bf16 load gives."""
    vae = tiny_reference_vae(family)
    generator = torch.Generator().manual_seed(0)
    channels = vae.latents_mean.numel()
    mean, std = torch.randn(channels, generator=generator), 0.5 + torch.rand(channels, generator=generator)
    vae.latents_mean.copy_(mean)
    vae.latents_std.copy_(std)
    vae.save_pretrained(str(tmp_path / "vae"))
    assert (mean.bfloat16().float() - mean).abs().max() > 1e-3  # what the old load used instead

    reference = load_reference_vae(family, str(tmp_path), torch.device("cpu"), sample_latents=False, dtype=torch.bfloat16)
    scale = vae.config.scaling_factor / std
    assert reference.dtype == torch.bfloat16
    assert torch.equal(reference.shift.flatten(), mean) and torch.equal(reference.scale.flatten(), scale)
    shift, read_scale = latent_space_transform(reference.vae, "normalized")
    assert torch.equal(shift, mean) and torch.equal(read_scale, scale)

    diffusers_bf16 = vae_class(family).from_pretrained(str(tmp_path / "vae"), torch_dtype=torch.bfloat16).state_dict()
    ours = reference.vae.state_dict()
    assert ours.keys() == diffusers_bf16.keys()
    for name, tensor in diffusers_bf16.items():
        if name not in ("latents_mean", "latents_std"):
            assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name

    # the normalisation itself runs in fp32: the latents are the bf16 VAE's raw latents, mapped exactly
    video = torch.rand(1, 9, 3, 32, 32, generator=generator)  # 1 latent pixel at 32x: bf16 runs slowly on a CPU
    with torch.no_grad():
        raw = reference.vae.encode((video.permute(0, 2, 1, 3, 4) * 2 - 1).bfloat16()).latent_dist.mode()
        expected = (raw.float().permute(0, 2, 1, 3, 4) - mean.view(1, 1, -1, 1, 1)) * scale.view(1, 1, -1, 1, 1)
        torch.testing.assert_close(reference.encode(video), expected, rtol=1e-6, atol=1e-6)
