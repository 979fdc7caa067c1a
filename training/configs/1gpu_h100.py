"""1 x H100 (debugging, small runs). Global batch: 4 per GPU x 1 GPU x 32 accumulation = 128.
n_frames 17 replaces the old 19, which CogVideoX cannot align (it needs 8k+1 frames): the
nearest valid count that does not need more memory. Memory per rank, as the dry run prints it
(training/plan/memory.py, measured at this shape, 4 x 17 x 480 x 720, bf16, every loss term): the
step measures 49.6 GB, the rank 52.8 GB of 80, within 90%; gradient_checkpointing=true or batch 2
leave room for more.

One process without a sharding engine (ddp_gpu_bf16.yaml: accelerate's bf16 autocast, fp32 weights,
fused AdamW): ZeRO shards nothing on one GPU, and its bookkeeping is host time a GPU step waits on.
Counted at the published notebook's recipe (python -m scripts.benchmark_notebook --host, 2026-11-27,
docs/performance.md#host-cost-per-step): 2,017 kernel-launching ops and 1 sync per step against
2,624 and 3 under ZeRO-2 (bucket copies, hooks, its norm's reads), both counted before Wan's
encode took fewer passes (341 fewer on either: 1,676 in one process now); the plan
gives 52.8 GB per rank against 53.4 under ZeRO-2. Its step time on an H100 is not measured yet
(make gpu-check's launch phase runs this profile)."""

overrides = dict(
    supported_num_gpus=(1,),
    accelerate_config="ddp_gpu_bf16.yaml",
    n_frames=17,
    batch_size_per_gpu=4,
    gradient_accumulation_steps=32,
    validation_samples=10,
    num_workers=4,
    log_every=50,
    nccl_timeout_s=1800,
)
