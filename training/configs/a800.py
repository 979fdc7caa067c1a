"""8 x A800 (80 GB, slower interconnect). Global batch: 2 per GPU x 8 GPUs x 8 accumulation = 128.
Memory per rank, as the dry run prints it (2 x 9 x 480 x 720, training/plan/memory.py): the step
measures 14.9 GB, the rank 18.2 GB of 80 (18.1 under ZeRO-2).
Engine: plain DDP in bf16 autocast (ddp_gpu_bf16.yaml; the launcher passes the process and machine
counts), chosen by measurement: ZeRO shards almost nothing of this student (the dry run under ZeRO-2:
weights 0.02, gradients 0.01, buckets 0.02, optimizer 0.02 GB; the rank is its activations and the
reference VAE), and costs the host. Per rank and optimizer step at the notebook's recipe on 2 CPU
processes (python -m scripts.benchmark_notebook --host --processes 2, 2026-11-28,
docs/performance.md#host-cost-of-a-multi-process-step): DDP 1,998 kernel-launching ops, 1,107 views,
1 sync; ZeRO-2 1,943-2,043 ops, 2,599-2,848 views, 1 sync; ZeRO-3 2,502 ops, 4,559 views, 2 syncs
(one process: 1,691 ops). DDP reduces once per accumulation window, ZeRO every micro-step. Its
checkpoint needs no gather (ZeRO-2: 384 blocking all-reduces). --set accelerate_config=deepspeed_8gpu.yaml
gives ZeRO-2 (or deepspeed_16gpu_zero3.yaml ZeRO-3); a run resumes across engines (docs/howto/resume.md)."""

overrides = dict(
    accelerate_config="ddp_gpu_bf16.yaml",
    batch_size_per_gpu=2,
    gradient_accumulation_steps=8,
)
