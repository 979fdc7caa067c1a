"""8 x H100 on one machine: the base values, nothing to change.
Global batch: 4 clips per GPU x 8 GPUs x 4 accumulation = 128.
Memory per rank, as the dry run prints it (python -m training.plan h100 --memory; measured at this
shape, 4 x 9 x 480 x 720, bf16, channels_last, every loss term; docs/performance.md's generated
table): the step measures 30.1 GB, the rank 33.1 GB of 80. Why not 8 clips per micro-step:
docs/performance.md#memory-per-rank-before-launch-trainingplanmemorypy.
n_frames is 9, not the 12 of the old configs: the CogVideoX VAE gives back the frames it was
given only for 8k+1 frames (an odd latent count; 12 or 13 frames decode to 16), and 9 is the
valid count closest to 12 that needs no more memory."""

overrides = dict()
