"""The embedded default: any laptop or CI machine, 1 or 2 CPU processes, autoencoder mode on
synthetic clips (nothing to download). Global batch: 8 per process x processes x 1 accumulation.

Tuned for validation PSNR within 10 minutes on 2 cores (docs/benchmarks.md has the runs): 32x32
crops of 4 frames (one latent; more frames or pixels cost more per step than they teach in
that time), batch 8 (better than 4 or 16 per second of training), a constant 5e-4 after warm-up
(1e-3 diverged to a saturated output; cosine decay was slower), frame stride 1 as in validation,
a short EMA, and 15% of 128 clips held out."""

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
    data_root="data/synthetic",
    synthetic_data=True,
    validation_fraction=0.15,
    max_frame_delta=1,
    height=32,
    width=32,
    n_frames=4,
    batch_size_per_gpu=8,
    gradient_accumulation_steps=1,
    global_batch_size=0,
    learning_rate=5e-4,
    lr_scheduler="constant_with_warmup",
    max_steps=900,
    warmup_steps=30,
    ema_decay=0.95,
    num_workers=1,
    log_every=20,
    validation_steps=300,
    validation_samples=16,
    checkpointing_steps=450,
    nccl_timeout_s=600,
)
