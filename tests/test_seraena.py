import pytest
import torch
import torch.nn.functional as F

from models.seraena import Seraena, group_frames, video_context


def spec_state_dict(spec: dict) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        k: torch.rand(shape, generator=generator) + 0.5 if shape else torch.tensor(7)
        for k, shape in spec["state_dict"].items()
    }


def striped_reals(n: int, size: int = 32) -> torch.Tensor:
    base = torch.full((n, 9, size, size), 0.7)
    base[:, :, ::2] += 0.2
    return (base + 0.02 * torch.randn_like(base)).clamp(0, 1)


def test_state_dict_layout_matches_public_files(seraena_spec):
    seraena = Seraena(seraena_spec["c_im"], seraena_spec["c_ctx"])
    assert {k: list(v.shape) for k, v in seraena.state_dict().items()} == seraena_spec["state_dict"]
    assert sum(p.numel() for p in seraena.parameters()) == seraena_spec["n_params"]


def test_public_file_loads_strict(seraena_spec, tmp_path):
    torch.save(spec_state_dict(seraena_spec), tmp_path / "seraena.pth")
    seraena = Seraena(9, 16)
    seraena.load_state_dict(torch.load(tmp_path / "seraena.pth", weights_only=True), strict=True)
    assert seraena.disc.blocks[0][1].num_batches_tracked.item() == 7


def test_discriminator_returns_six_score_maps():
    disc = Seraena(9, 16).disc
    scores = disc(torch.rand(2, 9, 64, 48), torch.randn(2, 16, 8, 6))
    assert scores.shape == (2, 6, 8, 6)


def test_correction_has_unit_std_and_leaves_discriminator_untouched():
    torch.manual_seed(0)
    seraena = Seraena(9, 16)
    context = torch.randn(4, 16, 4, 4)
    fake = torch.full((4, 9, 32, 32), 0.3)
    for _ in range(30):  # a discriminator that separates the two gives gradients far above 1e-5
        seraena.discriminator_step(striped_reals(4), fake, context)
    seraena.optimizer.zero_grad(set_to_none=True)
    before = {k: v.clone() for k, v in seraena.state_dict().items()}
    target = seraena.correct(striped_reals(4), fake.clone().requires_grad_(), context)
    assert not target.requires_grad
    assert abs((target - fake).std().item() - 1) < 0.01
    assert all(p.grad is None for p in seraena.parameters())
    assert all(torch.equal(before[k], v) for k, v in seraena.state_dict().items())  # eval mode: BN stats kept
    assert seraena.disc.training  # correct() restores the mode it found


def test_corrected_targets_move_fakes_toward_reals():
    """A 'generator' that only follows the corrected targets drifts from flat grey to the
    striped reals (measured against the noise-free real image)."""
    torch.manual_seed(0)
    seraena = Seraena(9, 16, seed=0)
    context = torch.zeros(8, 16, 2, 2)
    fake = torch.full((8, 9, 16, 16), 0.3, requires_grad=True)
    optimizer = torch.optim.Adam([fake], lr=2e-2)
    clean_real = torch.full((1, 9, 16, 16), 0.7)
    clean_real[:, :, ::2] += 0.2

    def distance() -> float:
        return (fake.detach().clamp(0, 1) - clean_real).pow(2).mean().item()

    start = distance()
    for _ in range(60):
        real = striped_reals(8, size=16)
        seraena.discriminator_step(real, fake.detach().clamp(0, 1), context)
        target = seraena.correct(real, fake.detach().clamp(0, 1), context)
        optimizer.zero_grad()
        F.mse_loss(fake, target).backward()
        optimizer.step()
    assert distance() < 0.5 * start


def test_training_state_round_trip_continues_exactly():
    torch.manual_seed(0)
    batches = [(torch.rand(4, 9, 16, 16), torch.rand(4, 9, 16, 16), torch.randn(4, 16, 2, 2)) for _ in range(6)]
    torch.manual_seed(1)
    straight = Seraena(9, 16, buffer_size=5, seed=3)
    for batch in batches:
        straight.discriminator_step(*batch)

    torch.manual_seed(1)
    first = Seraena(9, 16, buffer_size=5, seed=3)
    for batch in batches[:3]:
        first.discriminator_step(*batch)
    weights, training_state, rank_state = first.state_dict(), first.training_state_dict(), first.rank_state_dict()
    assert len(rank_state["buffer"]["shapes"]) == 5  # buffer full: later adds overwrite random slots
    resumed = Seraena(9, 16, buffer_size=5, seed=99)
    resumed.load_state_dict(weights)
    resumed.load_training_state_dict(training_state)
    resumed.load_rank_state_dict(rank_state)
    for batch in batches[3:]:
        resumed.discriminator_step(*batch)

    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert all(torch.equal(a, b) for a, b in zip(straight.buffer.fakes, resumed.buffer.fakes))


@pytest.mark.parametrize("where", ["gradient", "forward", "another rank"])
def test_a_non_finite_step_skips_the_discriminators_update_statistics_included_and_the_next_one_steps(where, monkeypatch):
    """Through SeraenaState, as a run steps its discriminator: a non-finite gradient after the reduction,
    a non-finite forward on this rank, or one on another rank (simulated: the all-reduce averages with a
    rank whose every value is NaN, as gloo and NCCL would) leaves the weights, the BatchNorm running
    statistics and counters, the moments and the step count as they were, decided on the device; the
    next finite step updates as usual. The statistics used to be averaged regardless: one rank's NaN
    reached every rank's, and every later correction was NaN (replaced, so no adversarial term)."""
    from training.step import seraena as run_seraena

    torch.manual_seed(0)
    state = run_seraena.SeraenaState(16, 3e-4, 8, seed=3, rank=0, device=torch.device("cpu"), amp_dtype=None)
    seraena = state.seraena
    real, decoded, latents = torch.rand(2, 6, 3, 8, 8), torch.rand(2, 6, 3, 8, 8), torch.randn(2, 2, 16, 1, 1)
    state.discriminator_step(real, decoded, latents)  # the moments exist
    weights = {k: v.clone() for k, v in seraena.disc.state_dict().items()}
    moments = {k: v.clone() for k, v in seraena.optimizer.state_dict()["state"][0].items()}
    reduce = run_seraena.all_reduce_mean
    if where == "gradient":  # one gradient overflowed after the reduction
        def overflowed(tensors):
            if len(tensors) == len(list(seraena.disc.parameters())):
                tensors[3].view(-1)[0] = float("nan")
        monkeypatch.setattr(run_seraena, "all_reduce_mean", overflowed)
    elif where == "another rank":
        monkeypatch.setattr(run_seraena, "all_reduce_mean", lambda tensors: [t.add_(float("nan")).div_(2) for t in tensors])
    state.discriminator_step(real.clone().fill_(float("nan")) if where == "forward" else real, decoded, latents)
    assert all(torch.equal(weights[k], v) for k, v in seraena.disc.state_dict().items())  # NaN equals nothing
    assert any("running_" in k for k in weights)  # the BatchNorm statistics are in the check
    assert all(torch.equal(moments[k], v) for k, v in seraena.optimizer.state_dict()["state"][0].items())
    monkeypatch.setattr(run_seraena, "all_reduce_mean", reduce)
    state.discriminator_step(real, decoded, latents)
    changed = {k for k, v in seraena.disc.state_dict().items() if v.is_floating_point() and not torch.equal(weights[k], v)}
    assert any("running_" in k for k in changed) and any("running_" not in k for k in changed)
    assert all(torch.isfinite(v).all() for v in seraena.disc.state_dict().values())


def test_reduce_gradients_hook_sees_every_gradient():
    seen = []
    seraena = Seraena(9, 16)
    seraena.discriminator_step(
        torch.rand(2, 9, 16, 16), torch.rand(2, 9, 16, 16), torch.randn(2, 16, 2, 2), reduce_gradients=seen.extend
    )
    assert len(seen) == len(list(seraena.disc.parameters()))


def test_video_grouping_and_context():
    frames = torch.arange(2 * 7 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 7, 3, 4, 4)
    grouped = group_frames(frames)
    assert grouped.shape == (4, 9, 4, 4)  # 2 clips x 2 whole groups of 3 frames
    assert torch.equal(grouped[1, 3:6], frames[0, 4])
    latents = torch.randn(2, 3, 16, 2, 2)
    context = video_context(latents, groups_per_clip=2)
    assert context.shape == (4, 16, 2, 2) and torch.allclose(context[3], latents[1].mean(0))


def test_runs_under_bfloat16_autocast():
    seraena = Seraena(9, 16, amp_dtype=torch.bfloat16)
    loss = seraena.discriminator_step(torch.rand(2, 9, 16, 16), torch.rand(2, 9, 16, 16), torch.randn(2, 16, 2, 2))
    assert torch.isfinite(loss)


def test_replay_buffer_is_compact_and_reads_old_fp32_checkpoints():
    """uint8 fakes and bf16 contexts (a quarter of fp32's host memory and checkpoint bytes),
    sampled back within 1/255; a buffer saved in fp32 by an earlier version still loads."""
    import random

    from models.seraena import ReplayBuffer

    fakes, contexts = torch.rand(4, 9, 8, 8), torch.randn(4, 16, 2, 2)
    buffer = ReplayBuffer(8, random.Random(0))
    buffer.add(fakes, contexts)
    assert {f.dtype for f in buffer.fakes} == {torch.uint8} and {c.dtype for c in buffer.contexts} == {torch.bfloat16}
    drawing = buffer.rng.getstate()
    sampled, sampled_context = buffer.sample(16)
    assert sampled.dtype == torch.float32 and 0 <= sampled.min() and sampled.max() <= 1
    buffer.rng.setstate(drawing)  # the slots it drew, and each one's pair as held
    slots = [buffer.rng.randrange(len(buffer)) for _ in range(16)]
    assert torch.equal(sampled, torch.stack([buffer.fakes[slot] for slot in slots]).float() / 255)
    assert torch.equal(sampled_context, torch.stack([buffer.contexts[slot] for slot in slots]).float())
    nearest = torch.cdist(sampled.flatten(1), fakes.flatten(1)).argmin(1)
    assert (sampled - fakes[nearest]).abs().max() <= 0.5 / 255 + 1e-6
    assert torch.allclose(sampled_context, contexts[nearest], rtol=1e-2, atol=1e-2)
    old = ReplayBuffer(8, random.Random(0))
    old.load_state_dict({"capacity": 8, "fakes": list(fakes), "contexts": list(contexts)})
    assert torch.equal(torch.stack(old.fakes), torch.stack(buffer.fakes))
