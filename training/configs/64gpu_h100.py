"""8 nodes x 8 H100. Global batch: 4 per GPU x 64 GPUs x 1 accumulation = 256, so the learning
rate doubles to 2e-4 (linear scaling from the 128-clip profiles). Memory per rank, as the dry run
prints it (4 x 9 x 480 x 720, training/plan/memory.py): the step measures 29.7 GB, the rank 32.9 GB of 80 (33.1 under ZeRO-2).
Engine: plain DDP in bf16 autocast (ddp_gpu_bf16.yaml), chosen by measurement as for h100 (its
docstring gives the host counts and the memory under each engine). --set accelerate_config=deepspeed_64gpu.yaml
gives ZeRO-2 (or deepspeed_64gpu_zero3.yaml ZeRO-3); a run resumes across engines."""

overrides = dict(
    supported_num_gpus=(64,),
    accelerate_config="ddp_gpu_bf16.yaml",
    batch_size_per_gpu=4,
    gradient_accumulation_steps=1,
    global_batch_size=256,
    learning_rate=2e-4,
    nccl_timeout_s=14400,
)
