"""2 nodes x 8 H100. Global batch: 4 per GPU x 16 GPUs x 2 accumulation = 128.
Memory per rank as h100 (the same micro-step), as the dry run prints it (python -m training.plan
16gpu_h100 --memory): the step measures 29.7 GB, the rank 32.9 GB of 80 (33.1 under ZeRO-2).
Engine: plain DDP in bf16 autocast (ddp_gpu_bf16.yaml), chosen by measurement as for h100 (its
docstring gives the host counts and the memory under each engine). --set accelerate_config=deepspeed_16gpu.yaml
gives ZeRO-2 (or deepspeed_16gpu_zero3.yaml ZeRO-3); a run resumes across engines."""

overrides = dict(
    supported_num_gpus=(16,),
    accelerate_config="ddp_gpu_bf16.yaml",
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
