"""8 nodes x 8 H100. Global batch: 4 per GPU x 64 GPUs x 1 accumulation = 256, so the learning
rate doubles to 2e-4 (linear scaling from the 128-clip profiles). Memory per rank, as the dry run
prints it (4 x 9 x 480 x 720, training/plan/memory.py): the step measures 30.1 GB, the rank 33.1 GB of 80."""

overrides = dict(
    supported_num_gpus=(64,),
    accelerate_config="deepspeed_64gpu.yaml",
    batch_size_per_gpu=4,
    gradient_accumulation_steps=1,
    global_batch_size=256,
    learning_rate=2e-4,
    nccl_timeout_s=14400,
)
