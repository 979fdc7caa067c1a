"""8 x A800 (80 GB, slower interconnect). Global batch: 2 per GPU x 8 GPUs x 8 accumulation = 128.
Memory per rank, as the dry run prints it (2 x 9 x 480 x 720, training/plan/memory.py): the step
measures 15.1 GB, the rank 18.1 GB of 80."""

overrides = dict(
    batch_size_per_gpu=2,
    gradient_accumulation_steps=8,
)
