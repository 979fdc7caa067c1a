"""8 x A800 (80 GB, slower interconnect). Global batch: 2 per GPU x 8 GPUs x 8 accumulation = 128.
Memory per rank, as the dry run prints it (2 x 9 x 480 x 720, training/plan/memory.py): the step
measures 14.9 GB, the rank 18.2 GB of 80 (18.1 under ZeRO-2).
Engine: plain DDP in bf16 autocast (ddp_gpu_bf16.yaml), chosen by measurement as for h100 (its
docstring gives the host counts and the memory under each engine). --set accelerate_config=deepspeed_8gpu.yaml
gives ZeRO-2 (or deepspeed_16gpu_zero3.yaml ZeRO-3); a run resumes across engines."""

overrides = dict(
    accelerate_config="ddp_gpu_bf16.yaml",
    batch_size_per_gpu=2,
    gradient_accumulation_steps=8,
)
