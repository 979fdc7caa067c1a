"""8 x H100 on one machine: the base values but the engine.
Global batch: 4 clips per GPU x 8 GPUs x 4 accumulation = 128.
Memory per rank, as the dry run prints it (python -m training.plan h100 --memory; measured at this
shape, 4 x 9 x 480 x 720, bf16, channels_last, every loss term; docs/performance.md's generated
table): the step measures 29.7 GB, the rank 32.9 GB of 80 (33.1 under ZeRO-2). Why not 8 clips per micro-step:
docs/performance.md#memory-per-rank-before-launch-trainingplanmemorypy.
n_frames is 9, not the 12 of the old configs: the CogVideoX VAE gives back the frames it was
given only for 8k+1 frames (an odd latent count; 12 or 13 frames decode to 16), and 9 is the
valid count closest to 12 that needs no more memory.
Engine: plain DDP in bf16 autocast (ddp_gpu_bf16.yaml; the launcher passes the process and machine
counts), chosen by measurement: ZeRO shards almost nothing of this student (the dry run under ZeRO-2:
weights 0.02, gradients 0.01, buckets 0.02, optimizer 0.02 GB; the rank is its activations and the
reference VAE), and costs the host. Per rank and optimizer step on 2 CPU processes (python -m
scripts.benchmark_notebook --host --processes 2, 2026-11-29, docs/performance.md#host-cost-of-a-multi-process-step),
at the notebook's recipe: DDP 1,998 kernel-launching ops (1.18x one process's 1,691), 1,107 views,
1 sync; ZeRO-2 1,943-2,043 ops, 2,599-2,848 views, 1 sync; ZeRO-3 2,502 ops, 4,559 views, 2 syncs.
At this profile's shape in space / 15 (4 micro-steps): DDP 7,604 ops (1.04x one process's 7,288),
1 sync; ZeRO-2 7,392-7,642 ops, 4 syncs; ZeRO-3 8,083 ops, 5 syncs. DDP reduces once per
accumulation window and agrees once at its end, ZeRO reduces (and so agrees) every micro-step. Its
checkpoint needs no gather (ZeRO-2: 384 blocking all-reduces). --set accelerate_config=deepspeed_8gpu.yaml
gives ZeRO-2 (or deepspeed_16gpu_zero3.yaml ZeRO-3); a run resumes across engines (docs/howto/resume.md)."""

overrides = dict(
    accelerate_config="ddp_gpu_bf16.yaml",
)
