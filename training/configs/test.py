"""The fastest real run, for tests: the cpu profile with tiny crops and a handful of steps.
Global batch: 1 per process x processes x 1 accumulation."""

base_profile = "cpu"

overrides = dict(
    height=32,
    width=32,
    n_frames=8,
    batch_size_per_gpu=1,
    max_steps=4,
    warmup_steps=1,
    ema_decay=0.9,
    num_workers=0,
    log_every=1,
    validation_steps=2,
    validation_samples=2,
    validation_batch_size=1,
    # the cpu profile's recipe for colour at two scales (issue 52) off: the tests' runs stay as fast and as
    # plain as before (one RGB loss, one size)
    validation_sizes=(),
    chroma_weight=0.0,
    half_size_every=0,
    # and its start from the block average (issue 61): tests that distil or fine-tune need the random one
    student_start="random",
    learning_rate=5e-4,
    checkpointing_steps=2,
    nccl_timeout_s=300,
)
