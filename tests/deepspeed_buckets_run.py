"""Run by tests/test_memory.py under `accelerate launch` with the 1-GPU production accelerate file
(ZeRO-2, bf16) on CPU: the DeepSpeed config build_accelerator gives the engine, and the bytes of
the gradient buckets DeepSpeed's optimizer really holds during one backward of the student,
printed as one JSON line."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.config.load import load_config  # noqa: E402
from training.loop.build import build_accelerator, build_model, check_deepspeed_batch  # noqa: E402
from training.step.optimizer import build_optimizer  # noqa: E402

config = load_config("test", ["accelerate_config=deepspeed_1gpu.yaml"], num_processes=1, check_paths=False)
accelerator = build_accelerator(config, Path(sys.argv[1]))
torch.manual_seed(0)
model = build_model(config)
optimizer, _ = build_optimizer(config, model)
model, optimizer = accelerator.prepare(model, optimizer)
check_deepspeed_batch(accelerator, config)
zero_optimizer = optimizer.optimizer  # accelerate's wrapper around DeepSpeed's ZeRO optimizer
held = []


def record(grad):
    # a tensor hook runs before DeepSpeed's own hook of that parameter: the bucket exists from the first one on
    held.append(sum(b.numel() * b.element_size() for bucket in zero_optimizer.ipg_buckets.values() for b in bucket.buffer))
    return grad


student = accelerator.unwrap_model(model)
for parameter in student.parameters():
    parameter.register_hook(record)
video = torch.rand(1, 8, 3, 32, 32).to(next(student.parameters()).dtype)
decoded = student.taehv.decode_video(student.taehv.encode_video(video))
accelerator.backward(torch.nn.functional.mse_loss(decoded.float(), video[:, : decoded.shape[1]].float()))
ds = accelerator.state.deepspeed_plugin.deepspeed_config
print("RESULT " + json.dumps({
    "zero_optimization": {k: ds["zero_optimization"].get(k) for k in ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm")},
    "communication_data_type": ds.get("communication_data_type"),
    "grad_accum_dtype": ds.get("data_types", {}).get("grad_accum_dtype"),
    "engine_communication_dtype": str(zero_optimizer.communication_data_type),
    "parameters": sum(p.numel() for p in student.parameters()),
    "bucket_bytes_during_backward": max(held),
    "bucket_bytes_after_backward": sum(b.numel() * b.element_size() for bucket in zero_optimizer.ipg_buckets.values()
                                       for b in bucket.buffer),
}), flush=True)
