"""Seraena's state in a run: the discriminator, its optimizer, the replay buffer, BatchNorm averaging
across ranks."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from models.metrics import aligned
from models.seraena import Seraena, group_frames, video_context
from training.config.views import student_of

COLLAPSED_LOSS = 1e-3  # MSE of the scores against +-1: below it the discriminator tells every fake apart


def all_reduce_mean(tensors: list[torch.Tensor]) -> None:
    """In place, across all ranks (no-op in one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1).float() for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t).to(t.dtype))
        offset += t.numel()


class BufferSnapshot:
    """Module buffers' values at one moment, kept flat per dtype (one copy each, not one per buffer), for
    restore_where: the buffers take these values back where a device flag says so, without a host read."""

    def __init__(self, buffers: list[torch.Tensor]):
        self.groups = {}
        for buffer in buffers:
            self.groups.setdefault(buffer.dtype, []).append(buffer)
        self.values = {dtype: flat(group) for dtype, group in self.groups.items()}

    def restore_where(self, flag: torch.Tensor) -> None:
        """Each buffer as it was where `flag` (a 0-dim bool tensor) is true, else as it is."""
        for dtype, group in self.groups.items():
            chosen = torch.where(flag, self.values[dtype], flat(group))
            parts = chosen.split([b.numel() for b in group])
            torch._foreach_copy_(group, [part.view_as(b) for part, b in zip(parts, group)])


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


class SeraenaState:
    """Seraena in a multi-process run: identical initial weights on every rank (seeded), gradients
    and BatchNorm statistics averaged each step, so weights and optimizer stay identical. The
    replay buffer and random state are deliberately per rank (each holds its own fakes): the
    shared part is registered with accelerate for checkpointing, each rank's own part is written
    beside it as seraena_rank<R>.pt (rank_state_dict)."""

    def __init__(self, latent_channels: int, learning_rate: float, buffer_size: int, seed: int, rank: int,
                 device: torch.device, amp_dtype: torch.dtype | None, buffer_entry_bytes: int | None = None):
        # the weights from a local generator seeded alike on every rank; the global generators
        # keep their per-rank state (nothing here may reseed them: that would reseed CUDA too)
        with torch.random.fork_rng(devices=[]):  # the default initialisation's CPU draws leave no trace
            self.seraena = Seraena(9, latent_channels, lr=learning_rate, buffer_size=buffer_size,
                                   seed=seed + rank, amp_dtype=amp_dtype, weight_seed=seed,
                                   buffer_entry_bytes=buffer_entry_bytes, pin_buffer=torch.device(device).type == "cuda")
        if next(self.seraena.parameters()).device != torch.device(device):  # (a no-op .to() fails under fake tensors)
            self.seraena.to(device)
        # for a reset after a collapse (reset_if_failing): the same initial state on every rank
        self.initial_weights = {k: v.detach().clone() for k, v in self.seraena.disc.state_dict().items()}
        self.optimizer_settings = {k: v for k, v in self.seraena.optimizer.defaults.items()
                                   if k in ("lr", "betas", "eps", "weight_decay", "fused")}
        self.failing_steps = torch.zeros((), dtype=torch.long, device=device)  # in a row, of the averaged loss
        self.resets = 0

    def loss(self, real: torch.Tensor, decoded: torch.Tensor, latents: torch.Tensor,
             update_discriminator: bool = True) -> torch.Tensor:
        """Steps the discriminator (when asked: once per optimizer step of the student, so every
        profile with the same global batch plays the same game whatever its accumulation), then
        returns MSE(decoded, corrected target) for the student. The loop calls it only on a step
        every rank agreed is finite, decode included (StepLosses.nonfinite)."""
        real_groups, fake_groups, context = self._groups(real, decoded, latents)
        if update_discriminator:
            self._discriminator_step(real_groups, fake_groups, context)
        target = self.seraena.correct(real_groups, fake_groups.detach().float(), context)
        # a non-finite correction (a broken discriminator) becomes none: the student never gets NaN from it
        target = torch.where(torch.isfinite(target), target, fake_groups.detach().float())
        return F.mse_loss(fake_groups.float(), target)

    def warm_up(self, real: torch.Tensor, decoded: torch.Tensor, latents: torch.Tensor) -> None:
        """cuDNN's tuning of the term's shapes, without a step (models/seraena.py Seraena.warm_up)."""
        real_groups, fake_groups, context = self._groups(real, decoded.detach(), latents)
        self.seraena.warm_up(real_groups, fake_groups.float(), context)

    def discriminator_step(self, real: torch.Tensor, decoded: torch.Tensor, latents: torch.Tensor) -> None:
        """The discriminator's step alone (its warm-up, before its term reaches the student)."""
        self._discriminator_step(*self._groups(real, decoded, latents))

    @staticmethod
    def _groups(real, decoded, latents):
        real_groups = group_frames(aligned(real, decoded)).float()  # under bf16 engines the input video is bf16
        fake_groups = group_frames(decoded)
        return real_groups, fake_groups, video_context(latents.detach().float(), fake_groups.shape[0] // decoded.shape[0])

    def _discriminator_step(self, real_groups, fake_groups, context) -> None:
        # the BatchNorm buffers as they were: the forward updates them on each rank before anything is agreed
        before = BufferSnapshot(list(self.seraena.disc.buffers()))
        # gradients averaged across ranks: a non-finite average skips the update on every rank alike
        self.seraena.discriminator_step(real_groups, fake_groups.detach().float(), context, reduce_gradients=all_reduce_mean)
        # the loss averaged with the BatchNorm statistics (one all-reduce): every rank counts the same collapse
        loss = self.seraena.last_stats["discriminator_loss"].reshape(1).float().clone()
        statistics = self.seraena.batchnorm_buffers()
        all_reduce_mean([*statistics, loss])
        # a step skipped for a non-finite gradient (one rank's non-finite forward spreads to all in the reduce)
        # or with non-finite averaged statistics keeps every buffer as it was, as the weights are kept: else one
        # rank's NaN statistics reach every rank, and correct()'s targets are NaN (replaced: no adversarial term)
        # from then on. Decided on the device, alike on every rank (both are of all-reduced values): no host read
        skipped = (self.seraena.optimizer.found_inf > 0) | ~torch.isfinite(torch.nn.utils.get_total_norm(statistics))
        before.restore_where(skipped)
        self.seraena.last_stats["discriminator_loss"] = loss[0]
        failing = ~torch.isfinite(loss[0]) | (loss[0] < COLLAPSED_LOSS)
        self.failing_steps = torch.where(failing, self.failing_steps + 1, torch.zeros_like(self.failing_steps))


    def reset_if_failing(self, steps: int) -> int:
        """When the discriminator's loss was non-finite or collapsed for `steps` optimizer steps in a
        row (0: never), its weights and optimizer start over from their initial values, the same on
        every rank (the count is of the all-reduced loss). Returns the steps it failed (0 when kept).
        Reads one device scalar: the loop calls it where it syncs anyway (a log step)."""
        failed = int(self.failing_steps.item())
        if not steps or failed < steps:
            return 0
        self.seraena.disc.load_state_dict(self.initial_weights)
        self.seraena.optimizer = torch.optim.AdamW(self.seraena.disc.parameters(), **self.optimizer_settings)
        self.failing_steps.zero_()
        self.resets += 1
        return failed

    def state_dict(self) -> dict:
        return {"weights": self.seraena.state_dict(), "training": self.seraena.training_state_dict(),
                "failing_steps": int(self.failing_steps), "resets": self.resets}

    def load_state_dict(self, state: dict) -> None:
        self.seraena.load_state_dict(state["weights"])
        self.seraena.load_training_state_dict(state["training"])
        self.failing_steps.fill_(int(state.get("failing_steps", 0)))
        self.resets = int(state.get("resets", 0))

    def rank_state_dict(self, with_buffer: bool = True) -> dict:
        return self.seraena.rank_state_dict(with_buffer)

    def load_rank_state_dict(self, state: dict) -> None:
        self.seraena.load_rank_state_dict(state)


GB = 1e9

def replay_pair_bytes(config, patch_size: int, latent_channels: int) -> int:
    """Host bytes of one replay-buffer entry (a slot of its slab): a group of 3 RGB frames (uint8) and
    its bf16 context (height and width are multiples of the latent side: the fake's bytes are even)."""
    latent_side = 8 * patch_size
    context = 2 * latent_channels * math.ceil(config.height / latent_side) * math.ceil(config.width / latent_side)
    return 9 * config.height * config.width + context


def replay_capacity(config, patch_size: int, latent_channels: int) -> int:
    """seraena_buffer_size, capped so the buffer stays within seraena_buffer_gb of host memory per rank."""
    fitting = int(config.seraena_buffer_gb * GB // replay_pair_bytes(config, patch_size, latent_channels))
    return max(1, min(config.seraena_buffer_size, fitting))


def replay_staging_bytes(config, patch_size: int, latent_channels: int) -> int:
    """Host bytes of the staging slab one discriminator step's fakes travel through (ReplayBuffer.add):
    a slot for each frame group of each clip's decode."""
    student = student_of(config)
    groups = student.decoded_frame_count(student.latent_frame_count(config.n_frames)) // 3
    return config.batch_size_per_gpu * groups * replay_pair_bytes(config, patch_size, latent_channels)


def replay_buffer_bytes(config, patch_size: int, latent_channels: int) -> int:
    """Host bytes of one rank's replay buffer: its slab, capacity x entry bytes, allocated (and on CUDA
    pinned) whole at the first entry (models/seraena.py ReplayBuffer). With aspect buckets pass the
    config at its largest bucket: every slot holds the largest entry."""
    return replay_capacity(config, patch_size, latent_channels) * replay_pair_bytes(config, patch_size, latent_channels)
