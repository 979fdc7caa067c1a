"""2 nodes x 8 H100. Global batch: 4 per GPU x 16 GPUs x 2 accumulation = 128.
Memory per rank as h100 (the same micro-step): the step measures about 39 GB, the rank about 45
of 80 (python -m training.plan 16gpu_h100 --memory)."""

overrides = dict(
    supported_num_gpus=(16,),
    accelerate_config="deepspeed_16gpu.yaml",
    gradient_accumulation_steps=2,
    warmup_steps=1500,
    checkpointing_steps=1000,
    validation_steps=500,
    validation_samples=24,
    num_workers=12,
    prefetch_factor=3,
    log_every=20,
    nccl_timeout_s=7200,
)
