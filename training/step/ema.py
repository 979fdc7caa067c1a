"""The EMA of the student's weights: whole on every rank, or partitioned like ZeRO's master weights.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class WeightEMA:
    """fp32 exponential moving average of the student's weights (the fp32 masters under DeepSpeed,
    never their bf16 rounding), on every rank, on the training device. Registered with accelerate
    for checkpointing."""

    def __init__(self, weights: dict[str, torch.Tensor], decay: float, device: torch.device):
        self.decay, self.device = decay, torch.device(device)
        self.shadow = {k: v.detach().float().to(self.device).clone() for k, v in weights.items()}
        self.blended: tuple[list, list] | None = None  # (averages, the tensors they follow): step() without DeepSpeed

    @torch.no_grad()
    def update(self, weights: dict[str, torch.Tensor]) -> None:
        """Blend in the current weights: fp32 (the optimizer's masters under DeepSpeed, see
        taehv_train.master_weights), one fused lerp over all tensors."""
        names = [n for n in self.shadow if n in weights]
        torch._foreach_lerp_([self.shadow[n] for n in names],
                             [weights[n].detach().to(self.device, torch.float32) for n in names], 1 - self.decay)

    @torch.no_grad()
    def step(self, accelerator, model) -> None:
        """After an optimizer step: blend in the optimizer's fp32 weights. Without DeepSpeed those are
        the parameters themselves, listed once (a walk of the module and two views per tensor each
        step cost more host time than the lerp: scripts/host_cost.py); under ZeRO-3 its masters,
        gathered each step."""
        from training.step.weights import live_weights, master_weights

        live = live_weights(accelerator, model) if self.blended is None else None
        if live is not None:
            names = [n for n in self.shadow if n in live]
            self.blended = [self.shadow[n] for n in names], [live[n] for n in names]
        if self.blended is None:  # DeepSpeed's masters
            self.update(master_weights(accelerator, model))
            return
        torch._foreach_lerp_(*self.blended, 1 - self.decay)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        """accelerate loads custom state with map_location="cpu": the average goes back to the
        training device, or every later update would copy every parameter to the host."""
        self.decay = state["decay"]
        self.shadow = {k: v.to(self.device, torch.float32).clone() for k, v in state["shadow"].items()}
        self.blended = None  # new averages: step() lists them again


class PartitionedEMA:
    """The same average under ZeRO-1/2 without a collective per step: each rank averages only the
    fragments of the fp32 masters its optimizer partition holds (DeepSpeed's per-parameter
    `_hp_mapping`; elementwise, so the values are those of WeightEMA bit for bit), plus buffers and
    frozen weights, which every rank holds whole. `shadow` (validation, export, checkpoints; every
    rank calls it) gathers the full weights in one all-reduce. Checkpoints hold the full average,
    as WeightEMA's do, so exact and elastic resume read them alike."""

    def __init__(self, weights: dict[str, torch.Tensor], decay: float, device: torch.device, student):
        self.decay, self.device = decay, torch.device(device)
        self.student = student
        self.trained = {name: p for name, p in student.taehv.named_parameters() if name not in student.frozen_weights}
        self.order = list(weights)
        self.local: dict[str, torch.Tensor | None] = {}
        self.load_full(weights)

    def _fragment(self, name: str):
        return getattr(self.trained[name], "_hp_mapping", None)

    def load_full(self, weights: dict[str, torch.Tensor]) -> None:
        for name, value in weights.items():
            value = value.detach().to(self.device, torch.float32)
            if name not in self.trained:
                self.local[name] = value.clone()
            elif self._fragment(name) is None:  # this rank's partition holds none of it
                self.local[name] = None
            else:
                address = self._fragment(name).lp_fragment_address
                self.local[name] = value.flatten()[address.start: address.start + address.numel].clone()

    def current(self, name: str) -> torch.Tensor:
        if name in self.trained:
            return self._fragment(name).hp_fragment
        if name in self.student.frozen_weights:
            return self.student.frozen_weights[name]
        return self.student.taehv.get_buffer(name)

    @torch.no_grad()
    def step(self, accelerator=None, model=None) -> None:
        names = [n for n, v in self.local.items() if v is not None]
        torch._foreach_lerp_([self.local[n] for n in names],
                             [self.current(n).detach().to(self.device, torch.float32) for n in names], 1 - self.decay)

    @property
    def shadow(self) -> dict[str, torch.Tensor]:
        """The full average on every rank: each rank writes its fragments into a zero buffer of all
        trained weights, one all-reduce sums them (fragments do not overlap)."""

        names = [n for n in self.order if n in self.trained]
        sizes = [self.trained[n].numel() for n in names]
        flat = torch.zeros(sum(sizes), device=self.device, dtype=torch.float32)
        for part, name in zip(flat.split(sizes), names):
            if self.local[name] is not None:
                address = self._fragment(name).lp_fragment_address
                part[address.start: address.start + address.numel] = self.local[name]
        group = next((p._dp_group for p in self.trained.values() if hasattr(p, "_dp_group")), None)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flat, group=group)
        full = {name: part.view(self.trained[name].shape) for part, name in zip(flat.split(sizes), names)}
        return {name: full[name] if name in full else self.local[name] for name in self.order}

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        self.decay = state["decay"]
        self.load_full(state["shadow"])
