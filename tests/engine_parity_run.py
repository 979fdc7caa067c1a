"""Run by tests/test_engine_parity.py under `accelerate launch` with an engine's accelerate file (DDP
fp32, DDP bf16, ZeRO-2, ZeRO-3) on 2 CPU processes: the `test` profile's student built as the loop
builds it (same seed: same weights on every rank and in the test's one-process reference), one
micro-step of the loop's local terms on this rank's half of a fixed global batch, the engine's
backward, then the full averaged gradient of every parameter (DeepSpeed's fp32 one, gathered from
its partitions). Rank 0 saves {"loss": the ranks' mean total, "terms": each term's mean, "grads":
name -> gradient} to argv[1]; argv[2:] are --set items."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.cpu_bf16 import bf16_convolutions  # noqa: E402
from training.base.unwrap import unwrap  # noqa: E402
from training.config.load import load_config  # noqa: E402
from training.loop.build import build_accelerator, build_lpips, build_model, check_deepspeed_batch  # noqa: E402
from training.step.losses import forward_losses  # noqa: E402
from training.step.optimizer import build_optimizer  # noqa: E402

GLOBAL_BATCH_SEED = 7


def global_batch(config, processes: int) -> torch.Tensor:
    """The same clips on every rank and in the reference: N,T,3,H,W in [0, 1], smooth enough to decode."""
    generator = torch.Generator().manual_seed(GLOBAL_BATCH_SEED)
    coarse = torch.rand(processes * config.batch_size_per_gpu, config.n_frames, 3, config.height // 4, config.width // 4,
                        generator=generator)
    return torch.nn.functional.interpolate(coarse.flatten(0, 1), size=(config.height, config.width), mode="bilinear",
                                           align_corners=False).unflatten(0, coarse.shape[:2]).clamp(0, 1)


def main(out: Path, sets: list[str]) -> None:
    config = load_config("test", sets, num_processes=2, check_paths=False)
    accelerator = build_accelerator(config, out.parent)
    torch.manual_seed(0)
    model = build_model(config)
    optimizer, _ = build_optimizer(config, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    check_deepspeed_batch(accelerator, config)
    lpips = build_lpips(config, accelerator.device)
    rank, size = accelerator.process_index, config.batch_size_per_gpu
    video = global_batch(config, accelerator.num_processes)[rank * size:(rank + 1) * size].to(accelerator.device)
    precision = torch.bfloat16 if config.mixed_precision == "bf16" else torch.float32
    with bf16_convolutions(accelerator.device, precision), accelerator.accumulate(model):  # as the loop's step runs
        losses = forward_losses(config, model, video, None, lpips, step=None)
        student = unwrap(accelerator, model)
        if accelerator.state.deepspeed_plugin is not None:
            from deepspeed.utils import safe_get_full_grad

            # the engine's backward (reduced at the window's end) without the step accelerate's backward adds
            model.set_gradient_accumulation_boundary(is_boundary=True)
            model.backward(losses.total)
            grads = {name: safe_get_full_grad(p) for name, p in student.named_parameters()}
        else:
            accelerator.backward(losses.total)
            grads = {name: p.grad for name, p in student.named_parameters()}
    terms = {name: value.float().reshape(1) for name, value in losses.logged.items()}
    for value in terms.values():
        torch.distributed.all_reduce(value)
    if rank == 0:
        torch.save({"loss": float(terms["loss"]) / accelerator.num_processes,
                    "terms": {name: float(value) / accelerator.num_processes for name, value in terms.items()},
                    "grads": {name: grad.detach().float().cpu() for name, grad in grads.items() if grad is not None}}, out)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    from training.base.fast_exit import exit_now

    # as the training entry point ends: a DeepSpeed rank's interpreter teardown can abort in C++
    # ("terminate called without an active exception", SIGABRT) after its result is written
    exit_now(main(Path(sys.argv[1]), sys.argv[2:]))
