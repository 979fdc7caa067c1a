"""The training state of a checkpoint, in one portable format that every resume reads.

accelerate's `save_state` would write the student and its optimizer in a form only a job of the
same process count and ZeRO stage can load (DeepSpeed's shards), so a checkpoint holds them once,
by parameter name, instead:

- `full_state.pt`: per parameter name, the fp32 master weight and AdamW's `exp_avg` and
  `exp_avg_sq`, plus the optimizer step (12 bytes per trained parameter: ~136 MB for taecvx),
  gathered through DeepSpeed's `safe_get_full_*` calls (or read directly from the torch optimizer
  under DDP / one process) and written by rank 0. Only rank 0 copies the tensors to the host.
- `topology.json`: processes, ZeRO stage, micro-batch, data position (batches drawn per rank).

Resume sets weights and optimizer state through `safe_set_full_*` (or directly) on any topology;
on the one that wrote the checkpoint it also restores each rank's random states (exact resume),
else it converts the data position by samples consumed and the per-rank random states start
fresh from the seed and step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from training.base.unwrap import unwrap
from training.config.schema import ResumeError

FULL_STATE = "full_state.pt"
TOPOLOGY = "topology.json"
OPTIMIZER_KEYS = ("exp_avg", "exp_avg_sq")


def deepspeed_engine(accelerator, model):
    return model if accelerator.state.deepspeed_plugin is not None else None


def named_parameters(accelerator, model) -> list[tuple[str, torch.nn.Parameter]]:
    """The trained parameters (frozen parts have no optimizer state and never change)."""
    return [(name, param) for name, param in unwrap(accelerator, model).named_parameters() if param.requires_grad]


def base_optimizer(accelerator, model, optimizer):
    """The torch AdamW underneath accelerate's and DeepSpeed's wrappers."""
    engine = deepspeed_engine(accelerator, model)
    if engine is not None:
        return engine.optimizer.optimizer
    return optimizer.optimizer if hasattr(optimizer, "optimizer") else optimizer


def optimizer_step(accelerator, model, optimizer) -> float:
    states = [s for s in base_optimizer(accelerator, model, optimizer).state.values() if "step" in s]
    return float(states[0]["step"]) if states else 0.0


def gather_full_state(accelerator, model, optimizer, to_host: bool = True) -> dict | None:
    """Every rank calls it (DeepSpeed's gathers are collective); CPU fp32 tensors on the ranks
    with `to_host`, None on the others (they only take part in the gathers)."""
    engine = deepspeed_engine(accelerator, model)
    if engine is None and not to_host:  # DDP and one process hold the full state on every rank: nothing to gather
        return None
    state = {"weights": {}, **{key: {} for key in OPTIMIZER_KEYS}}
    torch_state = base_optimizer(accelerator, model, optimizer).state
    stepped = any(len(s) for s in torch_state.values())  # before the first step AdamW has no moments
    if engine is not None:
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    for name, param in named_parameters(accelerator, model):
        if engine is not None:
            weight = safe_get_full_fp32_param(param)
            moments = {key: safe_get_full_optimizer_state(param, key) if stepped else torch.zeros_like(weight)
                       for key in OPTIMIZER_KEYS}
        else:
            weight = param.detach()
            moments = {key: torch_state.get(param, {}).get(key, torch.zeros_like(param)) for key in OPTIMIZER_KEYS}
        if to_host:  # one host copy on a GPU (.cpu()); on a CPU the live tensors, written at once
            state["weights"][name] = weight.detach().float().cpu()
            for key in OPTIMIZER_KEYS:
                state[key][name] = moments[key].detach().float().cpu()
    state["optimizer_step"] = optimizer_step(accelerator, model, optimizer)
    return state if to_host else None


def checkpoint_contract(config) -> dict:
    """What a checkpoint must share with the run that resumes it: the student's architecture and
    the objects registered with accelerate (scheduler and progress always; EMA and Seraena when on)."""
    from training.config.views import latent_space, student_of

    return {"model_variant": student_of(config).variant, "ref_vae_latent_space": latent_space(config),
            "registered": ["scheduler", "progress"] + ["ema"] * (config.ema_decay > 0) + ["seraena"] * (config.seraena_weight > 0)}


def check_resumable(folder: Path, config) -> None:
    """Raises ValueError with one line when `folder` cannot be resumed by this config (before any
    model is built), naming the setting and how to fix it."""
    from training.run.checkpoint_files import unsafe_files

    path = Path(folder) / TOPOLOGY
    if not path.is_file():
        raise ValueError(f"{folder} is not a checkpoint written by this trainer (no {TOPOLOGY}): "
                         "pass a checkpoints/checkpoint-N folder of a run")
    saved = json.loads(path.read_text())
    expected = checkpoint_contract(config)
    if saved.get("model_variant", expected["model_variant"]) != expected["model_variant"]:
        raise ValueError(f"{folder} holds a {saved['model_variant']!r} student but this run has model_variant="
                         f"{config.model_variant!r}{' (' + expected['model_variant'] + ')' if config.model_variant == 'auto' else ''}: resume with --set model_variant={saved['model_variant']} or start a new run folder")
    # checkpoints written before the key learnt raw latents; autoencoder mode ('') has no space to compare
    saved_space, space = saved.get("ref_vae_latent_space", "raw"), expected["ref_vae_latent_space"]
    if saved_space and space and saved_space != space:
        raise ValueError(f"{folder} holds a student trained on {saved_space} reference latents but this run learns {space} "
                         f"ones: resume with --set ref_vae_latent_space={saved_space} or start a new run folder")
    if saved.get("registered", expected["registered"]) != expected["registered"]:
        raise ValueError(f"{folder} was written with {', '.join(saved['registered'])} but this run has "
                         f"{', '.join(expected['registered'])}: keep ema_decay and seraena_weight on or off as in that run")
    if not (Path(folder) / FULL_STATE).is_file():
        raise ValueError(f"{folder} has no {FULL_STATE}: the checkpoint is incomplete; resume from another checkpoint")
    refused = unsafe_files(Path(folder))  # before anything is loaded: no file of it runs code
    if refused:
        raise ValueError(refused[0])


def full_state_files(state: dict, accelerator, config, micro_step: int) -> dict:
    """{file name: writer} of the training state, for rank 0 (the one holding `state`)."""
    topology = {"num_processes": accelerator.num_processes, "zero_stage": config.zero_stage,
                "batch_size_per_gpu": config.batch_size_per_gpu, "micro_step": micro_step,
                "state_fingerprint": state_fingerprint(state), **checkpoint_contract(config)}
    return {FULL_STATE: lambda path: torch.save(state, path),
            TOPOLOGY: lambda path: path.write_text(json.dumps(topology, indent=2) + "\n")}


def state_fingerprint(state: dict) -> str:
    """sha256 over weights and optimizer moments (names sorted): equal means the same training state."""
    digest = hashlib.sha256()
    for group in ("weights", *OPTIMIZER_KEYS):
        for name in sorted(state[group]):
            digest.update(f"{group}/{name}".encode())
            digest.update(state[group][name].numpy().tobytes())
    digest.update(repr(state["optimizer_step"]).encode())
    return digest.hexdigest()[:16]


def same_topology(folder: Path, accelerator, config) -> bool:
    path = folder / TOPOLOGY
    if not path.is_file():
        return True  # an older checkpoint: only the exact path can read it
    topology = json.loads(path.read_text())
    return (topology["num_processes"], topology["zero_stage"]) == (accelerator.num_processes, config.zero_stage)


@torch.no_grad()
def load_full_state(accelerator, model, optimizer, folder: Path) -> None:
    """Weights and optimizer moments by parameter name into whatever topology this job has."""
    state = torch.load(folder / FULL_STATE, map_location="cpu", weights_only=True)
    engine = deepspeed_engine(accelerator, model)
    params = named_parameters(accelerator, model)
    missing = [name for name, _ in params if name not in state["weights"]]
    if missing:
        raise ResumeError(f"{folder / FULL_STATE} holds no {missing[0]} (and {len(missing) - 1} more trained weights): "
                         "it was written for a student of another layout; resume from a checkpoint of this one")
    if engine is not None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        materialize_optimizer_state(engine.optimizer)
        link_optimizer_state = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link_optimizer_state is not None:  # ZeRO-1/2 and bf16 link optimizer-state views at the first step
            link_optimizer_state()
        zero3 = accelerator.state.deepspeed_plugin.zero_stage == 3
        for name, param in params:
            if zero3:
                for key in (None, *OPTIMIZER_KEYS):
                    set_zero3_partition(engine.optimizer, param, state[key or "weights"][name], key)
                continue
            safe_set_full_fp32_param(param, state["weights"][name].to(param.device))
            for key in OPTIMIZER_KEYS:
                safe_set_full_optimizer_state(param, state[key][name].to(param.device), key)
        copy_masters_into_module(accelerator, params, state["weights"])
    else:
        torch_optimizer = base_optimizer(accelerator, model, optimizer)
        for name, param in params:
            param.copy_(state["weights"][name].to(param.device, param.dtype))
            step_device = param.device if torch_optimizer.defaults.get("fused") else "cpu"
            torch_optimizer.state[param] = {
                "step": torch.tensor(state["optimizer_step"], dtype=torch.float32, device=step_device),
                **{key: state[key][name].to(param.device).clone() for key in OPTIMIZER_KEYS},
            }
    for moments in base_optimizer(accelerator, model, optimizer).state.values():  # AdamW's bias correction
        if torch.is_tensor(moments.get("step")):
            moments["step"].fill_(state["optimizer_step"])
        elif "step" in moments:
            moments["step"] = state["optimizer_step"]


def set_zero3_partition(zero_optimizer, param, value: torch.Tensor, key: str | None) -> None:
    """This rank's slice of one parameter's fp32 master (key None) or AdamW moment. DeepSpeed
    0.19.8's safe_set_full_* fails on the last rank's padded slice ("start + length exceeds
    dimension size"), so the slice is written here, padding zeroed, through the same internals."""
    partition, _ = zero_optimizer._get_fp32_opt_state_partition(param, release_swap_buffers=False, optim_state_key=key)
    start = partition.numel() * zero_optimizer._get_param_partition_rank(param)
    real = max(0, min(partition.numel(), value.numel() - start))
    partition.zero_()
    partition[:real].copy_(value.flatten()[start : start + real].to(partition.device, partition.dtype))


def materialize_optimizer_state(zero_optimizer) -> None:
    """torch's AdamW creates its state at the first step; a fresh engine has none to write into.
    One step with zero gradients at learning rate 0 creates it without moving any weight (AdamW's
    decoupled decay is scaled by the learning rate too); the step count is set afterwards.
    ZeRO-3 puts its flat fp32 partitions into the param groups only around its own steps."""
    optimizer = zero_optimizer.optimizer
    flat = getattr(zero_optimizer, "fp32_partitioned_groups_flat", None)
    if flat is not None:
        groups = [(zero_optimizer.sub_group_to_group_id[i], [tensor]) for i, tensor in enumerate(flat)]
    else:
        groups = [(i, group["params"]) for i, group in enumerate(optimizer.param_groups)]
    for group_id, params in groups:
        group = optimizer.param_groups[group_id]
        saved_params, saved_lr = group["params"], group["lr"]
        group["params"], group["lr"] = params, 0.0
        for param in params:
            param.grad = torch.zeros_like(param)
        optimizer.step()
        for param in params:
            param.grad = None
        group["params"], group["lr"] = saved_params, saved_lr


def copy_masters_into_module(accelerator, params, weights: dict) -> None:
    """The module's own (possibly bf16, possibly partitioned) copies follow the fp32 masters."""
    if accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=0):
            if accelerator.is_main_process:
                for name, param in params:
                    param.data.copy_(weights[name].to(param.device, param.dtype))
    else:
        for name, param in params:
            param.data.copy_(weights[name].to(param.device, param.dtype))


def converted_micro_step(folder: Path, accelerator, config) -> int:
    """Batches per rank after the change of process count, by samples consumed."""
    topology = json.loads((folder / TOPOLOGY).read_text())
    samples = topology["micro_step"] * topology["batch_size_per_gpu"] * topology["num_processes"]
    return samples // (config.batch_size_per_gpu * accelerator.num_processes)
