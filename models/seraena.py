"""Seraena: a conditional PatchGAN discriminator plus a corrector that turns its gradients into
pixel-space targets for a decoder (facts from the public madebyollin/seraena; our own code).

`Seraena.state_dict()` has the public layout (`disc.blocks.<i>.<0 conv|1 BatchNorm>.*`,
`disc.proj.<i>.weight`), so public `seraena.pth` files load. The discriminator's optimizer,
replay buffer and random generator live beside the module and are saved with
`training_state_dict()`.

Nothing distributed happens in here. A multi-process training loop keeps the discriminator
identical on every rank by passing `reduce_gradients` (e.g. an all-reduce mean of the gradients)
to `discriminator_step` and by averaging BatchNorm running statistics (`batchnorm_buffers()`).
"""

from __future__ import annotations

import copy
import math
import random
import warnings
import weakref
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# (out channels, kernel, stride) of the six blocks
DISCRIMINATOR_BLOCKS = ((64, 3, 1), (128, 4, 2), (256, 4, 2), (512, 4, 2), (512, 3, 1), (512, 3, 1))


class SeraenaDiscriminator(nn.Module):
    """disc(images N,c_im,H,W in [0, 1], context N,c_ctx,h,w) -> N,6,H/8,W/8 score maps."""

    def __init__(self, c_im: int, c_ctx: int, weight_seed: int | None = None):
        super().__init__()
        blocks, projections, c_in = [], [], c_im + c_ctx
        for c_out, kernel, stride in DISCRIMINATOR_BLOCKS:
            blocks.append(
                nn.Sequential(
                    nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=1, bias=False),
                    nn.BatchNorm2d(c_out),
                    nn.ReLU(inplace=True),
                )
            )
            projections.append(nn.Conv2d(c_out, 1, 1, bias=False))
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.proj = nn.ModuleList(projections)
        if weight_seed is not None:
            self.seed_weights(weight_seed)

    def seed_weights(self, seed: int) -> None:
        """The convolutions' default initialisation (kaiming-uniform, a=sqrt(5)) drawn from a local
        generator: identical weights on every rank without reseeding a global generator (which
        torch.manual_seed would do for every CUDA device too, after the per-rank seeding)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Conv2d):
                    weight = torch.empty(module.weight.shape)  # drawn on the CPU, so any device gets the same values
                    nn.init.kaiming_uniform_(weight, a=5**0.5, generator=generator)
                    module.weight.copy_(weight)

    def forward(self, images: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        h, w = images.shape[-2:]
        context = F.interpolate(context.to(images.dtype), size=(h, w), mode="nearest")
        x = torch.cat([images * 2 - 1, context], 1)
        score_size = (max(h // 8, 1), max(w // 8, 1))
        scores = []
        for block, projection in zip(self.blocks, self.proj):
            x = block(x)
            scores.append(F.adaptive_avg_pool2d(projection(x), score_size))
        return torch.cat(scores, 1)


def host_slab(nbytes: int, pinned: bool) -> torch.Tensor:
    """The replay buffer's one host allocation: exactly `nbytes` uint8, pinned when asked (CUDA).
    Pinned by registering the pages in place (cudaHostRegister): torch.empty(pin_memory=True) goes
    through torch's caching host allocator, which rounds every allocation up to a power of two
    (a 0.5 GB slab would pin 537 MB; one block per 3.28 MB entry at 480x720 pinned 4.46 MB). When
    registering fails the slab stays pageable: the copies into it then wait for the device."""
    slab = torch.empty(nbytes, dtype=torch.uint8)
    if pinned and nbytes:
        cudart = torch.cuda.cudart()
        result = cudart.cudaHostRegister(slab.data_ptr(), nbytes, 0)
        if result != cudart.cudaError.success:
            warnings.warn(f"replay buffer: cudaHostRegister of {nbytes:,} bytes failed ({result}); "
                          "it stays in pageable memory (its device-to-host copies then synchronise)")
        else:
            weakref.finalize(slab, _unregister, slab.data_ptr())
    return slab


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device`. To CUDA from pinned memory, without blocking: a copy from pageable
    memory makes the host wait for every kernel queued before it (the step's run-ahead lost)."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return (host if host.is_pinned() else host.pin_memory()).to(device, non_blocking=True)


def _unregister(address: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(address)
    except Exception:  # at interpreter exit CUDA may be gone already; the process's pages go with it
        pass


class ReplayBuffer:
    """Up to `capacity` past (fake, context) pairs in host memory; when full, a random slot is replaced.
    Fakes (frame groups in [0, 1]) are kept as uint8 and contexts as bf16, converted on the device
    before the copy: a quarter of the fp32 bytes in host memory, in each device-to-host copy and
    in checkpoints (1/255 steps are far below what the discriminator resolves).

    Every entry lives in one slab of capacity x entry_bytes, allocated once, at the first entry
    (host_slab: pinned on CUDA, exactly that size, which the plan's host line counts): slot i holds
    the fake's bytes, then the context's (at an even offset). A batch of entries arrives through a
    staging slab of its size (the plan's "replay staging" line), in one copy. Entries of a smaller
    shape (aspect buckets) use the start of their slot. `entry_bytes`: a slot's size, the largest entry the run
    makes (training/step/seraena.py replay_pair_bytes at the largest bucket); None: the first
    entry's. `pin_memory`: pin the slab (a run on CUDA); entries from a CUDA device pin it too."""

    def __init__(self, capacity: int, rng: random.Random, entry_bytes: int | None = None, pin_memory: bool = False):
        self.capacity = capacity
        self.rng = rng
        self.entry_bytes = entry_bytes
        self.pin_memory = pin_memory
        self.slab: torch.Tensor | None = None
        self.shapes: list[tuple[torch.Size, torch.Size]] = []  # per filled slot: (fake shape, context shape)
        self.staging: torch.Tensor | None = None  # the latest batch's rows, host_slab'd like the slab
        self.pending = None  # (their rows in the staging, their slots) until the buffer is next read
        self.copied = None  # CUDA event of the last asynchronous device-to-host copy

    def __len__(self) -> int:
        return len(self.shapes)

    @staticmethod
    def compact(fakes: torch.Tensor, contexts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if fakes.is_floating_point():
            fakes = (fakes.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        return fakes, contexts.detach().to(torch.bfloat16)

    @staticmethod
    def layout(fake_shape, context_shape) -> tuple[int, int]:
        """(the context's offset, the entry's bytes) in a slot: uint8 fake, then the bf16 context at an even offset."""
        fake_bytes = math.prod(fake_shape)
        offset = fake_bytes + fake_bytes % 2
        return offset, offset + 2 * math.prod(context_shape)

    def entry(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The (fake, context) held in `slot`: views into the slab."""
        self.wait_for_copies()
        fake_shape, context_shape = self.shapes[slot]
        offset, size = self.layout(fake_shape, context_shape)
        start = slot * self.entry_bytes
        fake = self.slab[start : start + math.prod(fake_shape)].view(fake_shape)
        return fake, self.slab[start + offset : start + size].view(torch.bfloat16).view(context_shape)

    @property
    def fakes(self) -> list[torch.Tensor]:
        return [self.entry(slot)[0] for slot in range(len(self))]

    @property
    def contexts(self) -> list[torch.Tensor]:
        return [self.entry(slot)[1] for slot in range(len(self))]

    def add(self, fakes: torch.Tensor, contexts: torch.Tensor) -> None:
        """Each entry's slot is drawn in turn (the next free one, then a random one). Their bytes
        travel packed as slot rows in one device-to-host copy into the staging slab (pinned, and
        asynchronous, on CUDA), and reach their slots when the buffer is next read (wait_for_copies:
        one optimizer step later, long finished). One copy, not two per entry."""
        fakes, contexts = self.compact(fakes, contexts)
        self.wait_for_copies()  # the previous entries are in their slots: the staging is free
        count, shapes = fakes.shape[0], (fakes.shape[1:], contexts.shape[1:])
        offset, size = self.layout(*shapes)
        pinned = self.pin_memory or fakes.is_cuda
        if self.slab is None:
            self.entry_bytes = self.entry_bytes or size
            self.slab = host_slab(self.capacity * self.entry_bytes, pinned)
        if size > self.entry_bytes:
            raise ValueError(f"replay buffer: an entry of {size:,} bytes (frame group {tuple(shapes[0])}, context "
                             f"{tuple(shapes[1])}) exceeds its slot of {self.entry_bytes:,} bytes: the slot size "
                             "must be the run's largest entry (training/step/seraena.py replay_pair_bytes)")
        if self.staging is None or self.staging.numel() < count * size:
            self.staging = host_slab(count * self.entry_bytes, pinned)  # a batch of the largest entries fits again
        slots = []
        for _ in range(count):
            slot = len(self) if len(self) < self.capacity else self.rng.randrange(self.capacity)
            if slot == len(self):
                self.shapes.append(shapes)
            else:
                self.shapes[slot] = shapes
            slots.append(slot)
        rows = [fakes.reshape(count, -1), contexts.reshape(count, -1).view(torch.uint8)]
        if offset > rows[0].shape[1]:  # the context at an even offset
            rows.insert(1, rows[0].new_zeros(count, offset - rows[0].shape[1]))
        staged = self.staging[: count * size].view(count, size)
        staged.copy_(torch.cat(rows, 1), non_blocking=fakes.is_cuda)
        self.pending = staged, slots
        if fakes.is_cuda:
            self.copied = torch.cuda.Event()
            self.copied.record()

    def wait_for_copies(self) -> None:
        """The latest entries into their slots, once their copy has arrived (a slot drawn twice in one
        batch holds the later entry, as writing them in turn would)."""
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None
        if self.pending is None:
            return
        staged, slots = self.pending
        self.pending = None
        latest = {slot: row for row, slot in enumerate(slots)}
        rows = staged if len(latest) == len(slots) else staged[list(latest.values())]
        self.slab.view(self.capacity, self.entry_bytes)[:, : staged.shape[1]].index_copy_(0, torch.tensor(list(latest)), rows)

    def sample(self, count: int, like: torch.Size | None = None, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor] | None:
        """(fakes in [0, 1], contexts) as float32 on `device`; with `like`, drawn among the fakes of
        that shape only (a run with aspect buckets holds several), None when none has it. They travel
        as held (uint8, bf16: a third of fp32's bytes), from pinned memory when the slab is pinned,
        without the host waiting for the device (a blocking copy from pageable memory would)."""
        self.wait_for_copies()
        pool = range(len(self))
        if like is not None and any(fake_shape != like for fake_shape, _ in self.shapes):
            pool = [slot for slot, (fake_shape, _) in enumerate(self.shapes) if fake_shape == like]
            if not pool:
                return None
        drawn = [pool[self.rng.randrange(len(pool))] for _ in range(count)]
        fake_shape, context_shape = self.shapes[drawn[0]]  # one shape among them (`like`, or a run's only one)
        slots = torch.tensor(drawn)
        offset, size = self.layout(fake_shape, context_shape)
        rows = self.slab.view(self.capacity, self.entry_bytes)
        # one gather per kind from the slab's rows (not a view, a copy and a stack per entry)
        fakes = rows[:, : math.prod(fake_shape)].index_select(0, slots).view(count, *fake_shape)
        contexts = rows[:, offset:size].index_select(0, slots).view(torch.bfloat16).view(count, *context_shape)
        return to_device(fakes, device).float() / 255, to_device(contexts, device).float()

    def state_dict(self) -> dict:
        """The filled slots only (slots fill in order: they are the slab's first len(self) rows), and
        each one's shapes: what the buffer holds, not its capacity. No host copy: the tensor saved
        views exactly those bytes of the slab (torch.save writes a tensor's whole storage, so a slice
        of the slab would write all of it)."""
        self.wait_for_copies()
        filled = len(self) * (self.entry_bytes or 0)
        held = torch.frombuffer(memoryview(self.slab.numpy())[:filled], dtype=torch.uint8) if filled else torch.empty(0, dtype=torch.uint8)
        return {"capacity": self.capacity, "entry_bytes": self.entry_bytes, "slab": held,
                "shapes": [(tuple(fake), tuple(context)) for fake, context in self.shapes]}

    def load_state_dict(self, state: dict) -> None:
        """Each saved entry back into the slot it held. Also reads the earlier formats (the whole slab,
        unfilled slots included; separate tensors per entry; fp32 fakes before the buffer was compact).
        The capacity stays this buffer's (what the plan counted); entries past it are left out."""
        self.wait_for_copies()
        self.shapes = []
        if "slab" in state:
            saved = ReplayBuffer(max(1, len(state["shapes"])), self.rng, state["entry_bytes"])
            saved.slab, saved.shapes = state["slab"], [(torch.Size(f), torch.Size(c)) for f, c in state["shapes"]]
            entries = [saved.entry(slot) for slot in range(len(saved))]
        else:
            entries = list(zip(state["fakes"], state["contexts"]))
        for fake, context in entries[: self.capacity]:  # into the next free slot each (no draw: not full)
            self.add(fake.unsqueeze(0), context.unsqueeze(0))


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A saved optimizer state into `optimizer`: its moments and step counts as saved, every setting of
    its param groups this optimizer's (learning rate, betas, weight decay as this run configures them;
    fused, foreach, capturable as this code builds it). torch's load_state_dict would restore the
    saved settings too: a checkpoint of an unfused AdamW (fused None) then refuses the found_inf a
    fused step passes ("Expected grad_scale and found_inf to be None"), and keeps its step counts on
    the host, where a fused step on CUDA wants them on the device."""
    groups = [{**{key: value for key, value in current.items() if key != "params"}, "params": saved["params"]}
              for current, saved in zip(optimizer.param_groups, state["param_groups"])]
    optimizer.load_state_dict({**state, "param_groups": groups + state["param_groups"][len(groups):]})


class Seraena(nn.Module):
    """Discriminator + corrector. Images are N,c_im,H,W in [0, 1]; contexts N,c_ctx,h,w latents."""

    def __init__(
        self,
        c_im: int,
        c_ctx: int,
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        buffer_size: int = 16384,
        seed: int = 0,
        amp_dtype: torch.dtype | None = None,
        weight_seed: int | None = None,
        buffer_entry_bytes: int | None = None,
        pin_buffer: bool = False,
    ):
        super().__init__()
        self.disc = SeraenaDiscriminator(c_im, c_ctx, weight_seed)
        # fused: one kernel for every weight (a loop of per-weight ops on a CPU, a dozen foreach
        # launches on CUDA), and it skips its update on the device when told found_inf
        self.optimizer = torch.optim.AdamW(self.disc.parameters(), lr=lr, betas=betas, fused=True)
        self.rng = random.Random(seed)
        self.buffer = ReplayBuffer(buffer_size, self.rng, buffer_entry_bytes, pin_buffer)
        self.amp_dtype = amp_dtype
        self.last_stats: dict[str, torch.Tensor] = {}  # of the latest discriminator step and correction, for logging

    def _scores(self, images: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        device_type = images.device.type
        with torch.amp.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            return self.disc(images, context).float()

    def discriminator_loss(self, real: torch.Tensor, fake: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """MSE of the score maps against +1 (fake) / -1 (real). The fake candidates are half the
        newest fakes and half replayed ones; each sample is real or fake with probability 1/2.
        The newest fakes then enter the replay buffer."""
        real, fake, context = real.detach(), fake.detach(), context.detach()
        n = fake.shape[0]
        candidates, candidate_context = fake, context
        if len(self.buffer) > 0:
            n_replay = n // 2
            replay = self.buffer.sample(n_replay, fake.shape[1:], fake.device) if n_replay else None  # same shape: aspect buckets
            if replay is not None:
                old_fake, old_context = replay
                candidates = torch.cat([fake[: n - n_replay], old_fake.to(fake.dtype)], 0)
                candidate_context = torch.cat([context[: n - n_replay], old_context.to(context.dtype)], 0)
        self.buffer.add(fake, context)
        use_fake = to_device(torch.tensor([self.rng.random() < 0.5 for _ in range(n)], dtype=torch.bool), fake.device)
        images = torch.where(use_fake[:, None, None, None], candidates, real)
        contexts = torch.where(use_fake[:, None, None, None], candidate_context, context)
        scores = self._scores(images, contexts)
        targets = torch.where(use_fake, 1.0, -1.0)[:, None, None, None].expand_as(scores)
        # detached, on the device (no sync): a sample counts as told apart when its mean score has the target's sign
        said_fake = scores.detach().flatten(1).mean(1) > 0
        self.last_stats["discriminator_accuracy"] = (said_fake == use_fake).float().mean()
        return F.mse_loss(scores, targets)

    def discriminator_step(
        self,
        real: torch.Tensor,
        fake: torch.Tensor,
        context: torch.Tensor,
        reduce_gradients: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> torch.Tensor:
        """One optimizer step of the discriminator; returns the (detached) loss. A non-finite gradient
        (after `reduce_gradients`: on any rank) skips the update, moments and step count included,
        decided on the device: no host sync."""
        self.disc.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.discriminator_loss(real, fake, context)
        loss.backward()
        gradients = [p.grad for p in self.disc.parameters() if p.grad is not None]
        if reduce_gradients is not None:
            reduce_gradients(gradients)
        self.optimizer.found_inf = (~torch.isfinite(torch.nn.utils.get_total_norm(gradients))).float()
        self.optimizer.step()
        self.last_stats["discriminator_loss"] = loss.detach()
        return loss.detach()

    def correct(self, real: torch.Tensor, fake: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Target = fake + correction, the correction being the negative gradient (w.r.t. an offset
        added to the fakes) of the per-sample squared score gap to the reals, scaled to unit
        standard deviation. The target carries no gradient."""
        was_training = self.disc.training
        self.disc.eval()
        try:
            with torch.no_grad():
                real_scores = self._scores(real.detach(), context.detach())
            with torch.enable_grad():
                offset = torch.zeros_like(fake, requires_grad=True)
                fake_scores = self._scores(fake.detach() + offset, context.detach())
                gap = (fake_scores - real_scores).pow(2).flatten(1).mean(1).sum()
                (gradient,) = torch.autograd.grad(gap, [offset])
        finally:
            self.disc.train(was_training)
        scale = gradient.std()
        self.last_stats["gradient_std"] = scale.detach()  # the raw pull toward the reals, before unit scaling
        correction = -gradient / (scale + 1e-5)
        return (fake.detach() + correction).detach()

    def warm_up(self, real: torch.Tensor, fake: torch.Tensor, context: torch.Tensor) -> None:
        """The discriminator's forward and backward and the correction once at these shapes, on a copy
        of the discriminator: cuDNN's autotuning (cudnn.benchmark) times each convolution shape at its
        first use, so a term that starts late is tuned here rather than mid-run. This Seraena's
        weights, statistics, optimizer, replay buffer, generator and logged stats are untouched."""
        disc, stats = self.disc, self.last_stats
        self.disc, self.last_stats = copy.deepcopy(disc).train(), {}
        try:
            self._scores(fake.detach(), context.detach()).square().mean().backward()  # the discriminator step's
            self.correct(real, fake, context)  # the student's target: the input-gradient convolutions
        finally:
            self.disc, self.last_stats = disc, stats

    def batchnorm_buffers(self) -> list[torch.Tensor]:
        """Running statistics a multi-process loop averages to keep ranks identical."""
        return [b for name, b in self.disc.named_buffers() if "running_" in name]

    def training_state_dict(self) -> dict:
        """The optimizer: with the weights, the state every rank of a run shares."""
        return {"optimizer": self.optimizer.state_dict()}

    def rank_state_dict(self, with_buffer: bool = True) -> dict:
        """Random state and (with_buffer) replay buffer: each rank's own (it holds its own fakes)."""
        return {"rng": self.rng.getstate(), **({"buffer": self.buffer.state_dict()} if with_buffer else {})}

    def load_training_state_dict(self, state: dict) -> None:
        load_optimizer_state(self.optimizer, state["optimizer"])
        if "buffer" in state:  # checkpoints written before the per-rank files held rank 0's here
            self.load_rank_state_dict(state)

    def load_rank_state_dict(self, state: dict) -> None:
        """A state without "buffer" (written with the buffer left out) keeps the current one."""
        if "buffer" in state:
            self.buffer.load_state_dict(state["buffer"])
        self.rng.setstate(state["rng"])


def group_frames(frames: torch.Tensor, group: int = 3) -> torch.Tensor:
    """N,T,C,H,W -> N*(T//group), group*C, H, W: consecutive frames stacked on channels.
    Trailing frames that do not fill a group are left out."""
    n, t, c, h, w = frames.shape
    usable = t - t % group
    return frames[:, :usable].reshape(n * (usable // group), group * c, h, w)


def video_context(latents: torch.Tensor, groups_per_clip: int) -> torch.Tensor:
    """N,t,L,h,w latents -> the clip's time-averaged latent, repeated for each of its frame groups."""
    return latents.mean(1).repeat_interleave(groups_per_clip, 0)
