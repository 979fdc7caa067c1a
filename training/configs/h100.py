"""8 x H100 on one machine: the base values, nothing to change.
Global batch: 8 clips per GPU x 8 GPUs x 2 accumulation = 128.
n_frames is 13, not the 12 of the old configs: CogVideoX takes 4k+1 frames (13 -> 4 latents)."""

overrides = dict()
