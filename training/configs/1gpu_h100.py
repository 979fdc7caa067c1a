"""1 x H100 (debugging, small runs). Global batch: 4 per GPU x 1 GPU x 32 accumulation = 128.
n_frames 17 replaces the old 19, which CogVideoX cannot align (it needs 8k+1 frames): the
nearest valid count that does not need more memory. Memory (training/plan/memory.py, measured at
this shape, 4 x 17 x 480 x 720, bf16, every loss term): the step about 66 GB, the whole rank
about 71 GB of 80, within 90%; gradient_checkpointing=true or batch 2 leave room for more."""

overrides = dict(
    supported_num_gpus=(1,),
    accelerate_config="deepspeed_1gpu.yaml",
    n_frames=17,
    batch_size_per_gpu=4,
    gradient_accumulation_steps=32,
    validation_samples=10,
    num_workers=4,
    log_every=50,
    nccl_timeout_s=1800,
)
