"""8 x A800 (80 GB, slower interconnect). Global batch: 2 per GPU x 8 GPUs x 8 accumulation = 128.
Memory per rank: the step (2 x 9 x 480 x 720) measures about 20 GB, the rank about 25 of 80
(training/plan/memory.py)."""

overrides = dict(
    batch_size_per_gpu=2,
    gradient_accumulation_steps=8,
)
