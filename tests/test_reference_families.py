"""Every reference family through its real diffusers class (tiny random configs): frame rule,
pixel convention, latent space, and the student variant that fits its latents."""

import pytest
import torch

from models.reference_families import FRAME_RULES, IMAGENET_MEAN, IMAGENET_STD, valid_frame_counts
from models.reference_vae import ReferenceVAE, student_fit_problem, tiny_reference_vae
from models.taehv import TAEHV

# family (wan layout), paired student, clip frames, side (a multiple of the spatial factor, two latents across)
CASES = [("hunyuan1_5", "2.1", "taehv1_5", 9, 32), ("wan", "2.2", "taew2_2", 9, 32), ("ltx", "2.1", "taeltx_2", 9, 64),
         ("ltx2", "2.1", "taeltx2_3", 9, 64), ("minimax_h3", "2.1", "taeh3", 22, 32)]


@pytest.mark.parametrize("family, layout, student_variant, frames, side", CASES)
def test_new_family_encodes_decodes_and_fits_its_student(family, layout, student_variant, frames, side):
    torch.manual_seed(0)
    vae = tiny_reference_vae(family, layout)
    reference = ReferenceVAE(vae, family, sample_latents=False)
    assert frames in valid_frame_counts(family, 40)
    video = torch.rand(1, frames, 3, side, side)
    student = TAEHV(student_variant).eval()
    with torch.no_grad():
        latents = reference.encode(video)
        assert latents.shape == student.encode_video(video).shape
        assert reference.decode(latents).shape == video.shape == student.decode_video(latents).shape
        # the latent space: the family's pipeline space (scaled for Hunyuan 1.5, normalized for the others)
        pixels = video.permute(0, 2, 1, 3, 4)
        if family == "minimax_h3":  # ImageNet-normalised pixels in, and out
            pixels = (pixels - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1)
        else:
            pixels = pixels * 2 - 1
        raw = vae.encode(pixels).latent_dist.mean.permute(0, 2, 1, 3, 4)
        if family == "hunyuan1_5":
            expected = raw * vae.config.scaling_factor
        elif family in ("ltx", "ltx2"):  # buffers, and the scaling factor, as the LTX pipelines apply them
            mean, std = (vae.latents_mean.view(1, 1, -1, 1, 1), vae.latents_std.view(1, 1, -1, 1, 1))
            expected = (raw - mean) * vae.config.scaling_factor / std
        else:
            mean, std = (torch.tensor(vae.config[k]).view(1, 1, -1, 1, 1) for k in ("latents_mean", "latents_std"))
            expected = (raw - mean) / std
        torch.testing.assert_close(latents, expected, atol=1e-4, rtol=1e-4)
        assert (latents - raw).abs().max() > 0.1  # the statistics of the tiny configs are far from 0 and 1
    assert student_fit_problem(reference, student_variant) == ""


def test_a_student_that_does_not_fit_is_named_with_the_one_that_does():
    reference = ReferenceVAE(tiny_reference_vae("wan", "2.2"), "wan", sample_latents=False)
    problem = student_fit_problem(reference, "taew2_1")
    assert problem == ("model_variant=taew2_1 gives 16 latent channels, 8x spatial and 2 latent frames for 5 frames, "
                       "but this wan VAE gives 48, 16x and 2: use model_variant=auto or taew2_2 or taew2_2_super")


def test_frame_rules_measured_on_the_classes_are_the_ones_declared():
    """n frames in, n frames out of the reference VAE, for the first counts of each rule."""
    for family, layout in (("hunyuan1_5", "2.1"), ("ltx2", "2.1"), ("minimax_h3", "2.1")):
        reference = ReferenceVAE(tiny_reference_vae(family, layout), family, sample_latents=False)
        modulus, remainder = FRAME_RULES[family]
        for n in valid_frame_counts(family, 2 * modulus + remainder + 1)[:2]:
            with torch.no_grad():
                assert reference.decode(reference.encode(torch.rand(1, n, 3, 32 if family != "ltx2" else 64, 64))).shape[1] == n


def test_a_family_is_one_record_read_without_torch():
    """The launcher's first step reads the records without torch; the tables other code reads are
    derived from them, and each record is consistent with itself."""
    import subprocess
    import sys
    from pathlib import Path

    from models.reference_families import FAMILY, FAMILY_RECORDS, SUPPORTED_LATENT_SPACES, public_variant
    from models.variants import VARIANTS

    probe = "import sys, models.reference_families; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=Path(__file__).resolve().parents[1])
    assert len(FAMILY) == len(FAMILY_RECORDS) == len({f.vae_class for f in FAMILY_RECORDS})
    for family in FAMILY_RECORDS:
        assert family.latent_space in family.latent_spaces
        assert SUPPORTED_LATENT_SPACES[family.name] == family.latent_spaces
        assert family.public_variant in VARIANTS and all(variant in VARIANTS for *_, variant in family.layouts)
        assert family.parameter_count > 1e6
    assert (public_variant("wan"), public_variant("wan", {"z_dim": 48})) == ("taew2_1", "taew2_2")


@pytest.mark.parametrize("layout", ["2.1", "2.2"])
def test_the_wan_encode_in_fewer_passes_gives_diffusers_latents(layout):
    """Wan's encode runs its encoder on the first frame, then on 8 frames at a time
    (wan_encode_in_fewer_passes), not 4: the same latents as diffusers' own encode, at frame counts
    its rule takes and one it trims (11 -> 9), to fp32's rounding (a convolution over more frames may
    sum in another order: 4e-7 at most measured; a misaligned piece is off by the latents' scale). The trainer's ReferenceVAE
    takes it from a freshly loaded VAE; tiling keeps diffusers' pieces."""
    from models.reference_vae import tiny_reference_vae_config, vae_class, wan_encode_in_fewer_passes

    torch.manual_seed(0)
    vae = vae_class("wan")(**tiny_reference_vae_config("wan", layout)).eval()
    passes = []
    vae.encoder.register_forward_pre_hook(lambda module, args: passes.append(args[0].shape[2]))
    reference = ReferenceVAE(vae, "wan", sample_latents=False)  # before any encode: nothing cached on the VAE yet
    clips = torch.rand(2, 17, 3, 32, 32)
    fewer = reference.encode(clips)
    assert passes == [1, 8, 8]
    for frames in (1, 5, 9, 13, 11):
        video = torch.rand(2, 3, frames, 32, 32) * 2 - 1
        with torch.no_grad():
            passes.clear()
            theirs = vae.encode(video).latent_dist
            assert passes == [1] + [4] * ((frames - 1) // 4)
            passes.clear()
            ours = wan_encode_in_fewer_passes(vae, video).latent_dist
        assert passes == {1: [1], 5: [1, 4], 9: [1, 8], 13: [1, 8, 4], 11: [1, 8]}[frames]
        torch.testing.assert_close(ours.mean, theirs.mean, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours.logvar, theirs.logvar, rtol=0, atol=1e-5)
    vae.enable_tiling()
    passes.clear()
    torch.testing.assert_close(reference.encode(clips), fewer, rtol=0, atol=1e-5)
    assert passes == [1, 4, 4, 4, 4]
