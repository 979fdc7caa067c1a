"""2 nodes x 8 H100. Global batch: 4 per GPU x 16 GPUs x 2 accumulation = 128.
Memory per rank as h100 (the same micro-step), as the dry run prints it (python -m training.plan
16gpu_h100 --memory): the step measures 29.7 GB, the rank 32.9 GB of 80 (33.1 under ZeRO-2).
Engine: plain DDP in bf16 autocast (ddp_gpu_bf16.yaml; the launcher passes the process and machine
counts), chosen by measurement: ZeRO shards almost nothing of this student (the dry run under ZeRO-2:
weights 0.02, gradients 0.01, buckets 0.02, optimizer 0.02 GB; the rank is its activations and the
reference VAE), and costs the host. Per rank and optimizer step at the notebook's recipe on 2 CPU
processes (python -m scripts.benchmark_notebook --host --processes 2, 2026-11-28,
docs/performance.md#host-cost-of-a-multi-process-step): DDP 1,998 kernel-launching ops, 1,107 views,
1 sync; ZeRO-2 1,943-2,043 ops, 2,599-2,848 views, 1 sync; ZeRO-3 2,502 ops, 4,559 views, 2 syncs
(one process: 1,691 ops). DDP reduces once per accumulation window, ZeRO every micro-step. Its
checkpoint needs no gather (ZeRO-2: 384 blocking all-reduces). --set accelerate_config=deepspeed_16gpu.yaml
gives ZeRO-2 (or deepspeed_16gpu_zero3.yaml ZeRO-3); a run resumes across engines (docs/howto/resume.md)."""

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
