"""1 x H100 (debugging, small runs). Global batch: 4 per GPU x 1 GPU x 32 accumulation = 128.
n_frames 17 replaces the old 19, which CogVideoX cannot align (it needs 8k+1 frames): the
nearest valid count that does not need more memory. Batch 4 per GPU, not the 8 of the other
profiles: 17 frames of 480x720 at batch 8 need an estimated 130 GB of activations
(training/memory.py; `--dry-run` prints it), batch 4 about 65 GB, within the 80 GB of an H100."""

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
