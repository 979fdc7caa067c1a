"""2 nodes x 8 H100. Global batch: 8 per GPU x 16 GPUs x 1 accumulation = 128."""

overrides = dict(
    supported_num_gpus=(16,),
    accelerate_config="deepspeed_16gpu.yaml",
    gradient_accumulation_steps=1,
    warmup_steps=1500,
    checkpointing_steps=1000,
    validation_steps=500,
    validation_samples=24,
    num_workers=12,
    prefetch_factor=3,
    log_every=20,
    nccl_timeout_s=7200,
)
