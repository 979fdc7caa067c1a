"""The latent-space check before fine-tuning: a student trained briefly in one space, against a
reference configured in the other, is refused with the better space named."""

import torch
import torch.nn.functional as F

from models.reference_vae import ReferenceVAE, tiny_reference_vae_config, vae_class
from models.taehv import TAEHV
from training.latent_space_check import latent_space_problem, latent_space_report


def test_a_student_trained_in_one_space_is_refused_in_the_other():
    torch.manual_seed(0)
    vae = vae_class("wan")(**tiny_reference_vae_config("wan")).eval()
    raw_reference = ReferenceVAE(vae, "wan", sample_latents=False, latent_space="raw")
    student = TAEHV("taew2_1")
    videos = [torch.rand(1, 5, 3, 32, 32)]
    targets = [raw_reference.encode(video) for video in videos]
    optimizer = torch.optim.AdamW(student.encoder.parameters(), lr=5e-3)
    for _ in range(100):  # a brief distillation of the encoder toward the raw latents
        for video, target in zip(videos, targets):
            loss = F.mse_loss(student.encode_video(video), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    student.eval()
    assert latent_space_problem(latent_space_report(student, raw_reference, videos)) == ""
    report = latent_space_report(student, ReferenceVAE(vae, "wan", sample_latents=False), videos)  # auto: normalized
    assert report["configured"] == "normalized" and len(report["student"]["rms"]) == 16
    mismatch = {space: values["mismatch"] for space, values in report["spaces"].items()}
    assert 2 * mismatch["raw"] < mismatch["normalized"], mismatch
    problem = latent_space_problem(report)
    assert problem.startswith("the starting weights encode to the reference's raw latents")
    assert "set ref_vae_latent_space=raw, or latent_space_check=false" in problem
