"""1 x H100 (debugging, small runs). Global batch: 8 per GPU x 1 GPU x 16 accumulation = 128.
n_frames 17 replaces the old 19, which CogVideoX cannot align (it needs 8k+1 frames): the
nearest valid count that does not need more memory."""

overrides = dict(
    supported_num_gpus=(1,),
    accelerate_config="deepspeed_1gpu.yaml",
    n_frames=17,
    gradient_accumulation_steps=16,
    validation_samples=10,
    num_workers=4,
    log_every=50,
    nccl_timeout_s=1800,
)
