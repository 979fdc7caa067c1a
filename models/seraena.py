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

import random
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


class ReplayBuffer:
    """Up to `capacity` past (fake, context) pairs on the CPU; when full, a random slot is replaced.
    Fakes (frame groups in [0, 1]) are kept as uint8 and contexts as bf16, converted on the device
    before the copy: a quarter of the fp32 bytes in host memory, in each device-to-host copy and
    in checkpoints (1/255 steps are far below what the discriminator resolves)."""

    def __init__(self, capacity: int, rng: random.Random):
        self.capacity = capacity
        self.rng = rng
        self.fakes: list[torch.Tensor] = []
        self.contexts: list[torch.Tensor] = []
        self.copied = None  # CUDA event of the last asynchronous device-to-host copy

    def __len__(self) -> int:
        return len(self.fakes)

    @staticmethod
    def compact(fakes: torch.Tensor, contexts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if fakes.is_floating_point():
            fakes = (fakes.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        return fakes, contexts.detach().to(torch.bfloat16)

    def add(self, fakes: torch.Tensor, contexts: torch.Tensor) -> None:
        """On CUDA the device-to-host copy runs asynchronously into pinned memory; the host waits
        for it only when it next reads the buffer (one optimizer step later, long finished)."""
        fakes, contexts = self.compact(fakes, contexts)
        if fakes.is_cuda:  # one pinned block per entry, so a replaced entry frees its own memory
            fakes, contexts = [self._to_pinned(f) for f in fakes], [self._to_pinned(c) for c in contexts]
            self.copied = torch.cuda.Event()
            self.copied.record()
        else:
            fakes, contexts = [f.clone() for f in fakes], [c.clone() for c in contexts]
        for fake, context in zip(fakes, contexts):
            if len(self.fakes) < self.capacity:
                self.fakes.append(fake)
                self.contexts.append(context)
            else:
                slot = self.rng.randrange(self.capacity)
                self.fakes[slot], self.contexts[slot] = fake, context

    @staticmethod
    def _to_pinned(tensor: torch.Tensor) -> torch.Tensor:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        return host.copy_(tensor, non_blocking=True)

    def wait_for_copies(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None

    def sample(self, count: int, like: torch.Size | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(fakes in [0, 1], contexts), as float32 on the CPU; with `like`, drawn among the fakes of
        that shape only (a run with aspect buckets holds several), None when none has it."""
        self.wait_for_copies()
        pool = range(len(self.fakes))
        if like is not None and any(fake.shape != like for fake in self.fakes):
            pool = [i for i, fake in enumerate(self.fakes) if fake.shape == like]
            if not pool:
                return None
        slots = [pool[self.rng.randrange(len(pool))] for _ in range(count)]
        fakes = torch.stack([self.fakes[i] for i in slots]).float() / 255
        return fakes, torch.stack([self.contexts[i] for i in slots]).float()

    def state_dict(self) -> dict:
        self.wait_for_copies()
        return {"capacity": self.capacity, "fakes": list(self.fakes), "contexts": list(self.contexts)}

    def load_state_dict(self, state: dict) -> None:
        """Also reads checkpoints written before the buffer was compact (fp32 fakes)."""
        self.capacity = state["capacity"]
        pairs = [self.compact(f, c) for f, c in zip(state["fakes"], state["contexts"])]
        self.fakes = [f for f, _ in pairs]
        self.contexts = [c for _, c in pairs]


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
    ):
        super().__init__()
        self.disc = SeraenaDiscriminator(c_im, c_ctx, weight_seed)
        self.optimizer = torch.optim.AdamW(self.disc.parameters(), lr=lr, betas=betas)
        self.rng = random.Random(seed)
        self.buffer = ReplayBuffer(buffer_size, self.rng)
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
            replay = self.buffer.sample(n_replay, fake.shape[1:]) if n_replay else None  # same shape: aspect buckets
            if replay is not None:
                old_fake, old_context = replay
                candidates = torch.cat([fake[: n - n_replay], old_fake.to(fake)], 0)
                candidate_context = torch.cat([context[: n - n_replay], old_context.to(context)], 0)
        self.buffer.add(fake, context)
        use_fake = torch.tensor([self.rng.random() < 0.5 for _ in range(n)], dtype=torch.bool, device=fake.device)
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
        """One optimizer step of the discriminator; returns the (detached) loss."""
        self.disc.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.discriminator_loss(real, fake, context)
        loss.backward()
        if reduce_gradients is not None:
            reduce_gradients([p.grad for p in self.disc.parameters() if p.grad is not None])
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

    def batchnorm_buffers(self) -> list[torch.Tensor]:
        """Running statistics a multi-process loop averages to keep ranks identical."""
        return [b for name, b in self.disc.named_buffers() if "running_" in name]

    def training_state_dict(self) -> dict:
        """The optimizer: with the weights, the state every rank of a run shares."""
        return {"optimizer": self.optimizer.state_dict()}

    def rank_state_dict(self) -> dict:
        """Replay buffer and random state: each rank's own (it holds its own fakes)."""
        return {"buffer": self.buffer.state_dict(), "rng": self.rng.getstate()}

    def load_training_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
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
