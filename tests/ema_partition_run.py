"""Run by tests/test_training.py under `accelerate launch` with a ZeRO-2 file and 2 processes: the
partitioned EMA (no collective per step) against the gathered one over real optimizer steps of
the student, bit for bit, and through a checkpoint's state round trip."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.config.load import load_config  # noqa: E402
from training.loop.build import build_accelerator, build_model  # noqa: E402
from training.step.ema import PartitionedEMA, WeightEMA  # noqa: E402
from training.step.weights import full_state_dict, weights_fingerprint  # noqa: E402

config = load_config("test", ["accelerate_config=deepspeed_cpu.yaml"], num_processes=2, check_paths=False)
accelerator = build_accelerator(config, Path(sys.argv[1]))
torch.manual_seed(0)
model = build_model(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer = accelerator.prepare(model, optimizer)
student = accelerator.unwrap_model(model)
weights = full_state_dict(accelerator, model)
gathered = WeightEMA(weights, 0.8, accelerator.device)
partitioned = PartitionedEMA(weights, 0.8, accelerator.device, student)
torch.manual_seed(1 + accelerator.process_index)
for _ in range(3):
    video = torch.rand(1, 8, 3, 32, 32)
    decoded = student.taehv.decode_video(student.taehv.encode_video(video))
    accelerator.backward(torch.nn.functional.mse_loss(decoded, video[:, : decoded.shape[1]]))
    optimizer.step()
    optimizer.zero_grad()
    gathered.step(accelerator, model)
    partitioned.step()
full = partitioned.shadow
equal = full.keys() == gathered.shadow.keys() and all(torch.equal(full[k], gathered.shadow[k]) for k in full)
moved = any(not torch.equal(full[k], weights[k].to(full[k].device)) for k in full)
restored = PartitionedEMA(weights, 0.5, accelerator.device, student)
restored.load_state_dict({k: (v.cpu() if torch.is_tensor(v) else {n: t.cpu() for n, t in v.items()}) if k == "shadow" else v
                          for k, v in partitioned.state_dict().items()})
round_trip = weights_fingerprint({k: v.cpu() for k, v in restored.shadow.items()}) == weights_fingerprint({k: v.cpu() for k, v in full.items()})
print(f"rank {accelerator.process_index}: partitioned EMA equal {equal}, moved {moved}, round trip {round_trip}, "
      f"fragments held {sum(v is not None for n, v in partitioned.local.items() if n in partitioned.trained)} "
      f"of {len(partitioned.trained)}", flush=True)
