"""8 x H100 on one machine: the base values, nothing to change.
Global batch: 8 clips per GPU x 8 GPUs x 2 accumulation = 128.
n_frames is 9, not the 12 of the old configs: the CogVideoX VAE gives back the frames it was
given only for 8k+1 frames (an odd latent count; 12 or 13 frames decode to 16), and 9 is the
valid count closest to 12 that needs no more memory."""

overrides = dict()
