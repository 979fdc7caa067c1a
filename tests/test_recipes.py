"""Recipes users ask for (docs/training.md#recipes): decoder-only (or encoder-only) fine-tuning
of a public weight file, with the frozen part exported bit-equal."""

import pytest
import torch

from models.taehv import TAEHV
from training.builders import build_model, build_optimizer
from training.config import ConfigError, load_config
from training.distill import compute_losses


@pytest.fixture(scope="module")
def public_weights(tmp_path_factory):
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("weights") / "taehv.pth"
    torch.save(TAEHV("taehv").state_dict(), path)
    return path


def test_a_frozen_encoder_gets_no_gradients_and_no_optimizer_state(public_weights):
    config = load_config("test", [f"pretrained_model_path={public_weights}", "train_encoder=false", "n_frames=8"])
    student = build_model(config)
    optimizer, _ = build_optimizer(config, student)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for p in student.taehv.decoder.parameters()}
    loss, _ = compute_losses(config, student, torch.rand(1, 8, 3, 32, 32), None, None)
    loss.backward()
    assert all(p.grad is None for p in student.taehv.encoder.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.taehv.decoder.parameters())
    optimizer.step()
    assert set(optimizer.state) <= {p for p in student.taehv.decoder.parameters()}


def test_freezing_everything_or_random_weights_is_refused(public_weights):
    with pytest.raises(ConfigError, match="train_encoder=false and train_decoder=false: nothing would train"):
        load_config("test", [f"pretrained_model_path={public_weights}", "train_encoder=false", "train_decoder=false"])
    with pytest.raises(ConfigError, match="train_decoder=false with pretrained_model_path='' would freeze randomly"):
        load_config("test", ["train_decoder=false"])

# The decoder-only fine-tune under bf16 ZeRO-2 through the launcher (the frozen encoder exported
# bit-equal) shares the 2-process run of test_launchers::test_production_and_ddp_files_train_with_two_cpu_processes.
