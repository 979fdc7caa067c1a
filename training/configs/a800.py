"""8 x A800 (80 GB, slower interconnect). Global batch: 2 per GPU x 8 GPUs x 8 accumulation = 128."""

overrides = dict(
    batch_size_per_gpu=2,
    gradient_accumulation_steps=8,
)
