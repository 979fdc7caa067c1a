"""Seraena's replay buffer in host memory: one slab of capacity x entry bytes, allocated once, which
is what the plan's host line counts (on CUDA that slab is pinned in place: torch's pinned allocator
would round each allocation up to a power of two). The CPU shows the bytes held and the one
allocation; the GPU test shows that the slab is pinned and that torch's pinned allocator holds none of it."""

import random
from types import SimpleNamespace

import pytest
import torch

import models.seraena
from models.taehv import TAEHV
from training.config.load import load_config
from training.config.views import at_largest_bucket, student_of
from training.loop.build import build_seraena
from training.plan.memory import GB, estimate_memory
from training.step.seraena import replay_capacity, replay_pair_bytes, replay_staging_bytes

BUCKETS = ((24, 40), (40, 24), (32, 32))


def held_bytes(buffer) -> int:
    """Bytes of every tensor storage the buffer holds (whatever attributes hold them), each once."""
    tensors = [value for value in vars(buffer).values() if isinstance(value, torch.Tensor)]
    tensors += [item for value in vars(buffer).values() if isinstance(value, list) for item in value
                if isinstance(item, torch.Tensor)]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def steps(seraena, taehv, shapes, generator):
    """One discriminator step per (height, width): real clips of that shape, their decode and latents."""
    for height, width in shapes:
        video = torch.rand(2, 8, 3, height, width, generator=generator)
        with torch.no_grad():
            latents = taehv.encode_video(video)
            decoded = taehv.decode_video(latents)
        seraena.discriminator_step(video, decoded, latents)


@pytest.mark.parametrize("buckets", [(), BUCKETS], ids=["one shape", "aspect buckets"])
def test_the_replay_buffer_holds_one_slab_of_what_the_plan_counts(buckets, monkeypatch):
    """The buffer allocates once, capacity x the largest entry (host_slab, the call that pins on
    CUDA), at its first entry, and a staging slab for a step's entries; the bytes it holds are the plan's host line from then on, while
    entries are added, replace others (the capacity is 6 entries, each step adds 2: 10 in all) and come in
    several shapes."""
    sets = ["seraena_weight=0.1", "batch_size_per_gpu=2", "seraena_buffer_size=6"]
    config = load_config("test", sets + ([f"buckets={','.join(f'{h},{w}' for h, w in buckets)}"] if buckets else []),
                         1, check_paths=False)
    taehv = TAEHV(student_of(config)).eval()
    largest = at_largest_bucket(config)
    planned = (replay_capacity(largest, taehv.patch_size, taehv.latent_channels)
               * replay_pair_bytes(largest, taehv.patch_size, taehv.latent_channels))  # capacity x the largest entry
    staging = replay_staging_bytes(largest, taehv.patch_size, taehv.latent_channels)  # a step's 2 fakes on their way in
    assert estimate_memory(config).host["replay buffer"] == planned / GB
    assert estimate_memory(config).host["replay staging"] == staging / GB == 2 * planned / 6 / GB
    allocations = []
    real_slab = getattr(models.seraena, "host_slab", None)
    monkeypatch.setattr(models.seraena, "host_slab", lambda nbytes, pinned: allocations.append((nbytes, pinned))
                        or real_slab(nbytes, pinned), raising=False)
    seraena = build_seraena(config, SimpleNamespace(device=torch.device("cpu"), process_index=0), taehv)
    buffer = seraena.seraena.buffer
    shapes = list(buckets) or [(32, 32)]
    generator = torch.Generator().manual_seed(0)
    steps(seraena, taehv, shapes[:1], generator)
    assert len(buffer) == 2 and held_bytes(buffer) == planned + staging
    steps(seraena, taehv, (shapes * 4)[:4], generator)  # full, then replacing random slots
    assert len(buffer) == 6 and held_bytes(buffer) == planned + staging
    assert allocations == [(planned, False), (staging, False)]  # the slab and the staging, pinned only on CUDA
    # each slot gives back the entry of its shape, and a checkpoint of it loads into a new buffer alike
    fakes = buffer.fakes
    assert {tuple(fake.shape[1:]) for fake in fakes} == set(shapes) and all(f.dtype == torch.uint8 for f in fakes)
    state = buffer.state_dict()
    # its filled slots as they are (all 6 here): no second host copy of the buffer
    assert state["slab"].data_ptr() == buffer.slab.data_ptr() and state["slab"].untyped_storage().nbytes() == planned
    buffer.state_dict = lambda: pytest.fail("the buffer was read for a checkpoint that leaves it out")
    assert "buffer" not in seraena.rank_state_dict(with_buffer=False)
    del buffer.state_dict
    again = models.seraena.ReplayBuffer(buffer.capacity, random.Random(0), buffer.entry_bytes)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(again.fakes + again.contexts, buffer.fakes + buffer.contexts))
    assert held_bytes(again) == planned + buffer.entry_bytes  # loaded entry by entry: a staging of one


def test_a_checkpoint_holds_the_filled_slots_only_and_loads_them_back_exactly(tmp_path):
    """After one discriminator step, 2 of 1,024 slots are filled: the rank file holds those 2 entries
    (what the plan's checkpoint line counts for a 1-step run), not the slab; loaded into a fresh buffer
    they are the same entries in the same slots, so replay draws the same fakes. The earlier format,
    the whole slab with its unfilled slots, still loads."""
    from training.plan.memory import checkpoint_cost

    config = load_config("test", ["seraena_weight=0.1", "batch_size_per_gpu=2", "max_steps=1"], 1, check_paths=False)
    taehv = TAEHV(student_of(config)).eval()
    seraena = build_seraena(config, SimpleNamespace(device=torch.device("cpu"), process_index=0), taehv)
    steps(seraena, taehv, [(32, 32)], torch.Generator().manual_seed(0))
    buffer = seraena.seraena.buffer
    assert (len(buffer), buffer.capacity) == (2, 1024)
    torch.save(seraena.rank_state_dict(), tmp_path / "seraena_rank0.pt")
    state = torch.load(tmp_path / "seraena_rank0.pt", weights_only=True)
    assert state["buffer"]["slab"].numel() == 2 * buffer.entry_bytes == checkpoint_cost(config, taehv).replay_bytes
    assert (tmp_path / "seraena_rank0.pt").stat().st_size < 3 * buffer.entry_bytes + 20_000  # entries, shapes, random state
    again = build_seraena(config, SimpleNamespace(device=torch.device("cpu"), process_index=0), taehv).seraena
    again.buffer.load_state_dict(state["buffer"])
    assert again.buffer.shapes == buffer.shapes
    assert all(torch.equal(a, b) for a, b in zip(again.buffer.fakes + again.buffer.contexts, buffer.fakes + buffer.contexts))
    again.rng.setstate(buffer.rng.getstate())
    assert all(torch.equal(a, b) for a, b in zip(again.buffer.sample(5), buffer.sample(5)))
    whole = {**buffer.state_dict(), "slab": buffer.slab.clone()}  # as checkpoints before this one wrote it
    assert whole["slab"].numel() == 1024 * buffer.entry_bytes
    older = models.seraena.ReplayBuffer(1024, random.Random(0))
    older.load_state_dict(whole)
    assert all(torch.equal(a, b) for a, b in zip(older.fakes + older.contexts, buffer.fakes + buffer.contexts))


def test_a_batch_arrives_in_one_copy_and_a_slot_drawn_twice_holds_the_later_entry():
    """A full buffer replaces random slots; a batch's entries travel together and are put in their
    slots at the next read, with what writing them in turn would leave (6 draws into 2 slots repeat)."""
    buffer = models.seraena.ReplayBuffer(2, random.Random(1))
    held = list(torch.rand(2, 9, 4, 4))
    buffer.add(torch.stack(held), torch.randn(2, 4, 1, 1))
    draws = random.Random()
    draws.setstate(buffer.rng.getstate())
    fakes = torch.rand(6, 9, 4, 4)
    buffer.add(fakes, torch.randn(6, 4, 1, 1))
    for fake in fakes:
        held[draws.randrange(2)] = fake
    assert torch.equal(torch.stack(buffer.fakes), (torch.stack(held) * 255).round().to(torch.uint8))


def test_an_entry_larger_than_its_slot_is_refused_with_the_sizes():
    buffer = models.seraena.ReplayBuffer(4, random.Random(0), entry_bytes=9 * 8 * 8 + 2 * 4)
    buffer.add(torch.rand(2, 9, 8, 8), torch.rand(2, 4, 1, 1))
    with pytest.raises(ValueError, match=r"an entry of 2,336 bytes \(frame group \(9, 16, 16\), context \(4, 2, 2\)\) "
                                         r"exceeds its slot of 584 bytes"):
        buffer.add(torch.rand(1, 9, 16, 16), torch.rand(1, 4, 2, 2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check runs these on one)")
def test_on_cuda_the_slab_is_pinned_in_place_at_its_exact_size():
    before = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) if hasattr(torch.cuda, "host_memory_stats") else 0
    buffer = models.seraena.ReplayBuffer(8, random.Random(0), entry_bytes=9 * 480 * 720 + 2 * 16 * 60 * 90)
    fakes, contexts = torch.rand(4, 9, 480, 720, device="cuda"), torch.randn(4, 16, 60, 90, device="cuda")
    buffer.add(fakes, contexts)
    assert buffer.slab.is_pinned() and buffer.slab.untyped_storage().nbytes() == 8 * (9 * 480 * 720 + 2 * 16 * 60 * 90)
    after = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) if hasattr(torch.cuda, "host_memory_stats") else 0
    assert after == before  # torch's pinned allocator (power-of-two rounding) holds none of it
    buffer.wait_for_copies()  # the copies into the slab ran asynchronously
    assert torch.equal(torch.stack(buffer.fakes), (fakes * 255).round().to(torch.uint8).cpu())
    assert torch.equal(torch.stack(buffer.contexts), contexts.to(torch.bfloat16).cpu())
    # replayed entries come back to the device without a blocking copy from pageable memory, as held
    sampled_fakes, sampled_contexts = buffer.sample(3, device="cuda")
    assert sampled_fakes.is_cuda and sampled_fakes.dtype == torch.float32 and sampled_contexts.is_cuda
    held = (fakes * 255).round() / 255
    assert all(any(torch.equal(fake, entry) for entry in held) for fake in sampled_fakes)
