"""The latent-space check before fine-tuning: starting weights that speak one space, against a
reference configured in the other, are refused with the better space named.

The starting "students" here encode exactly into one space (the reference's own map), so the
outcome depends on no training trajectory and holds on any CPU; a brief distillation of a real
TAEHV used to stand in for them and landed on either side of the margin on different CPUs."""

import pytest
import torch

from models.reference_vae import ReferenceVAE, tiny_reference_vae_config, vae_class
from training.loop.latent_space_check import latent_space_problem, latent_space_report


class SpeaksOneSpace(torch.nn.Module):
    """Starting weights whose encoder is exactly `reference`'s map into its latent space."""

    def __init__(self, reference: ReferenceVAE):
        super().__init__()
        self.reference = reference
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # the report reads the student's dtype from it

    def encode_video(self, video: torch.Tensor) -> torch.Tensor:
        return self.reference.encode(video)


@pytest.fixture(scope="module")
def wan():
    torch.manual_seed(0)
    vae = vae_class("wan")(**tiny_reference_vae_config("wan")).eval()
    return {space: ReferenceVAE(vae, "wan", sample_latents=False, latent_space=space) for space in ("raw", "normalized")}


@pytest.mark.parametrize("speaks, configured", [("raw", "normalized"), ("normalized", "raw")])
def test_starting_weights_in_one_space_are_refused_in_the_other(wan, speaks, configured):
    videos = [torch.rand(1, 5, 3, 32, 32)]
    student = SpeaksOneSpace(wan[speaks])
    assert latent_space_problem(latent_space_report(student, wan[speaks], videos)) == ""
    report = latent_space_report(student, wan[configured], videos)
    assert report["configured"] == configured and len(report["student"]["rms"]) == 16
    mismatch = {space: values["mismatch"] for space, values in report["spaces"].items()}
    assert mismatch[speaks] < 1e-6 < mismatch[configured], mismatch
    problem = latent_space_problem(report)
    assert problem.startswith(f"the starting weights encode to the reference's {speaks} latents")
    assert f"set ref_vae_latent_space={speaks}, or latent_space_check=false" in problem

