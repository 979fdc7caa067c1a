"""Every cross-field rule a config can fail, one line each naming the key and the fix.
"""

from __future__ import annotations

from models.reference_families import FAMILIES, FRAME_RULES, LATENT_SPACES
from models.variants import VARIANTS, block_average_start_problem
from training.base.lr_schedule import SCHEDULES
from training.base.storage import ObjectStore, StorageError, is_remote
from training.config.inputs import check_required_paths
from training.config.terms import (
    LOSS_TERMS,
    TERMS_BY_NAME,
    WEIGHT_KEYS,
    discriminator_start,
    schedule,
    student_needs,
)
from training.config.schema import (
    ACCELERATE_CONFIG_DIR,
    CAPPED_TO_MAX_STEPS,
    COMPILE_BACKENDS,
    STUDENT_STARTS,
    ConfigError,
    TrainConfig,
)
from training.config.views import (
    _nearest,
    decoded_frame_count,
    latent_space,
    measured_geometry,
    resolve_reference,
    student_of,
    valid_frame_counts,
)


def _names_a_class(ref_vae_path: str) -> bool:
    from models.vae_geometry import read_vae_config

    try:
        read_vae_config(ref_vae_path)
    except ValueError:
        return False
    return True


SIZE_LISTS = ("buckets", "validation_sizes")  # keys holding (height, width) pairs


def size_pairs(c: TrainConfig, key: str, multiple: int, variant: str) -> tuple:
    """A list of sizes as ((height, width), ...): config files give pairs, --set a flat h,w,h,w list."""
    value = getattr(c, key)
    flat = all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    if flat and len(value) % 2:
        raise ConfigError(f"{key}={','.join(map(str, value))}: --set lists height,width pairs, e.g. "
                          f"{key}=256,448,448,256,320,320; this has an odd count")
    pairs = tuple(zip(value[::2], value[1::2])) if flat else value
    if not all(isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
               for p in pairs):
        raise ConfigError(f"{key}={value!r}: expected (height, width) pairs of ints, e.g. ((256, 448), (448, 256), (320, 320))")
    pairs = tuple((int(h), int(w)) for h, w in pairs)
    for h, w in pairs:
        if h <= 0 or w <= 0 or h % multiple or w % multiple:
            fix = "x".join(str(max(multiple, round(x / multiple) * multiple)) for x in (h, w))
            raise ConfigError(f"{key}: {h}x{w} must have both sides positive multiples of {multiple} for {variant}: use {fix}")
    repeated = sorted({f"{h}x{w}" for h, w in pairs if pairs.count((h, w)) > 1})
    if repeated:
        raise ConfigError(f"{key} lists {', '.join(repeated)} more than once: remove the repeat")
    return pairs


def bucket_pairs(c: TrainConfig, multiple: int, variant: str) -> tuple:
    """buckets as ((height, width), ...), checked against the latent cache."""
    pairs = size_pairs(c, "buckets", multiple, variant)
    if pairs and c.latent_cache:
        raise ConfigError(f"buckets with latent_cache={c.latent_cache!r}: a cache stores one crop per clip at height x "
                          "width; set buckets=() to train from the cache, or latent_cache='' to train in buckets")
    return pairs


def validation_size_pairs(c: TrainConfig, multiple: int, variant: str) -> tuple:
    """validation_sizes as ((height, width), ...), cut from the clips (no latent cache)."""
    pairs = size_pairs(c, "validation_sizes", multiple, variant)
    if pairs and c.latent_cache:
        raise ConfigError(f"validation_sizes with latent_cache={c.latent_cache!r}: a cache stores one crop per clip at "
                          "height x width; set validation_sizes=() to train from the cache")
    return pairs


LPIPS_SMALLEST_SIDE = 31  # AlexNet's trunk (an 11x11 stride-4 convolution, two 3x3 stride-2 pools) at 30 pixels has nothing left


def validate(config: TrainConfig, check_paths: bool = True) -> None:
    c = config
    if c.model_variant not in (*VARIANTS, "auto"):
        raise ConfigError(f"model_variant={c.model_variant!r} is not a TAEHV variant; choose auto or one of {', '.join(VARIANTS)}")
    if c.ref_vae_family not in (*FAMILIES, "auto"):
        raise ConfigError(f"ref_vae_family={c.ref_vae_family!r}: choose auto or one of {', '.join(FAMILIES)}")
    if c.ref_vae_latent_space not in ("auto", *LATENT_SPACES):
        raise ConfigError(f"ref_vae_latent_space={c.ref_vae_latent_space!r}: choose auto, {', '.join(LATENT_SPACES)}")
    resolve_reference(c)
    try:
        latent_space(c)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    args = student_of(c)
    if c.pretrained_model_path and args.variant not in VARIANTS:
        raise ConfigError(f"pretrained_model_path={c.pretrained_model_path!r}: model_variant=auto built {args.variant} for "
                          f"{c.reference_family}, which has no public weights: set pretrained_model_path='' to train it "
                          "from scratch")
    if c.student_start == "block_average":
        if c.pretrained_model_path or c.use_ref_vae:
            raise ConfigError("student_start=block_average makes its own latent space (RGB means): set "
                              "pretrained_model_path='' and use_ref_vae=false, or student_start=random")
        problem = block_average_start_problem(args)
        if problem:
            raise ConfigError(f"student_start=block_average with model_variant={args.variant}: {problem}; use student_start=random")
    frames = valid_frame_counts(c)
    if c.n_frames not in frames:
        if c.reference_geometry:
            from models.vae_geometry import frame_rule_text

            rule = frame_rule_text(measured_geometry(c), args)
        elif c.use_ref_vae:
            rule = "{}k+{}".format(*FRAME_RULES[c.reference_family])
        else:
            rule = "{}k+{}".format(*args.frame_rule()) if args.chunk else f"a multiple of {args.t_downscale}"
        mode = f"the {c.reference_family} reference VAE (needs {rule})" if c.use_ref_vae else f"autoencoder mode (needs {rule})"
        raise ConfigError(f"n_frames={c.n_frames} gives no whole latent frame count for {mode}: use {_nearest(c.n_frames, frames)}")
    if args.latent_frame_count(c.n_frames) < 2 and not c.image_only:  # TGrow's other outputs and the memory blocks' `past` get no gradient
        enough = min(n for n in frames if args.latent_frame_count(n) >= 2)
        raise ConfigError(f"n_frames={c.n_frames} gives 1 latent frame: the decoder's temporal layers would not train; "
                          f"use {enough} or more (or set image_only=true for an image autoencoder)")
    decoded_frames = decoded_frame_count(c)
    if c.seraena_weight > 0 and decoded_frames < 3:
        raise ConfigError(f"seraena_weight={c.seraena_weight} needs at least 3 decoded frames (one group), "
                          f"n_frames={c.n_frames} gives {decoded_frames}: raise n_frames or set seraena_weight=0")
    if c.seraena_weight > 0 and c.batch_size_per_gpu * (decoded_frames // 3) < 2:
        # Seraena's BatchNorm normalises each discriminator batch: one sample has no batch statistics
        raise ConfigError(f"seraena_weight={c.seraena_weight}: Seraena's BatchNorm needs at least 2 frame groups per rank, "
                          f"batch_size_per_gpu={c.batch_size_per_gpu} x {decoded_frames // 3} group(s) of 3 decoded frames "
                          f"gives {c.batch_size_per_gpu * (decoded_frames // 3)}: raise batch_size_per_gpu or n_frames, "
                          "or set seraena_weight=0")
    if (c.temporal_weight > 0 or "flicker" in c.best_metric) and decoded_frames < 2:
        what = f"temporal_weight={c.temporal_weight}" if c.temporal_weight > 0 else f"best_metric={c.best_metric}"
        raise ConfigError(f"{what} compares consecutive frames, n_frames={c.n_frames} gives {decoded_frames} decoded frame: "
                          f"raise n_frames, or set temporal_weight=0 and another best_metric")
    multiple = 8 * args.patch_size
    for key in ("height", "width"):
        value = getattr(c, key)
        if value <= 0 or value % multiple:
            raise ConfigError(f"{key}={value} must be a positive multiple of {multiple} for {args.variant}: use {max(multiple, value // multiple * multiple)}")
    c.buckets = bucket_pairs(c, multiple, args.variant)
    c.validation_sizes = validation_size_pairs(c, multiple, args.variant)
    if c.perceptual_weight > 0:  # LPIPS's AlexNet pools its input down to nothing below 31 pixels a side
        sizes = list(c.buckets) or [(c.height, c.width)]
        smallest = min(min(size) for size in sizes) // (2 if c.half_size_every else 1)
        if smallest < LPIPS_SMALLEST_SIDE:
            pooled = f" and half_size_every={c.half_size_every} pools it 2x to {smallest}" if c.half_size_every else ""
            raise ConfigError(f"perceptual_weight={c.perceptual_weight}: LPIPS needs clips of at least {LPIPS_SMALLEST_SIDE} pixels "
                              f"a side, the smallest training size is {min(min(size) for size in sizes)}{pooled}: raise height "
                              f"and width{' to 64' if c.half_size_every else ''}"
                              f"{', set half_size_every=0' if c.half_size_every else ''} or set perceptual_weight=0")
    if not 1 <= c.min_frame_delta <= c.max_frame_delta:
        raise ConfigError(f"min_frame_delta={c.min_frame_delta}, max_frame_delta={c.max_frame_delta}: need 1 <= min <= max")
    metrics = ("psnr", "ssim", "lpips", "flicker") + (("decode_psnr", "decode_ssim", "decode_lpips", "decode_flicker")
                                                     if c.use_ref_vae else ())
    for key in ("short_clip_policy", "pixel_loss", "best_metric", "sample_data", "lr_scheduler", "student_start"):
        allowed = {"short_clip_policy": ("skip", "loop"), "pixel_loss": ("mse", "l1"), "best_metric": metrics,
                   "sample_data": ("", "real", "synthetic"), "lr_scheduler": SCHEDULES, "student_start": STUDENT_STARTS}[key]
        if getattr(c, key) not in allowed:
            raise ConfigError(f"{key}={getattr(c, key)!r}: choose one of {', '.join(allowed)}")
    for key in ("max_steps", "step_timeout_s", "batch_size_per_gpu", "gradient_accumulation_steps", "log_every", "validation_steps",
                "checkpointing_steps", "validation_batch_size", "checkpoints_total_limit", "prefetch_factor", "chroma_pool"):
        if getattr(c, key) < 1:
            raise ConfigError(f"{key}={getattr(c, key)} must be at least 1")
    if c.gpu_memory_gb <= 0:
        raise ConfigError(f"gpu_memory_gb={c.gpu_memory_gb} must be positive (80 for an H100 SXM, 141 for an H200)")
    frozen = [part for part in ("encoder", "decoder") if not getattr(c, f"train_{part}")]
    if len(frozen) == 2:
        raise ConfigError("train_encoder=false and train_decoder=false: nothing would train; set one of them to true")
    if frozen and not c.pretrained_model_path:
        raise ConfigError(f"train_{frozen[0]}=false with pretrained_model_path='' would freeze randomly initialised "
                          f"weights: set pretrained_model_path to the weights to fine-tune, or train_{frozen[0]}=true")
    if c.half_size_every < 0:
        raise ConfigError(f"half_size_every={c.half_size_every} must be 0 (off) or a step interval, e.g. 2 (every other step)")
    if c.half_size_every and (c.use_ref_vae or c.latent_cache):
        raise ConfigError(f"half_size_every={c.half_size_every} needs autoencoder mode (the reference latents are of the "
                          "full-size clips): set use_ref_vae=false and latent_cache='', or half_size_every=0")
    odd = [f"{h}x{w}" for h, w in ((c.height, c.width), *c.buckets) if h % (2 * multiple) or w % (2 * multiple)]
    if c.half_size_every and odd:
        raise ConfigError(f"half_size_every={c.half_size_every} halves {', '.join(odd)}: height and width (and buckets) "
                          f"must be multiples of {2 * multiple}, or set half_size_every=0")
    if c.crop_min_side < 0:
        raise ConfigError(f"crop_min_side={c.crop_min_side} must be 0 (off) or a side in pixels, e.g. 64")
    if c.crop_min_side and c.latent_cache:
        raise ConfigError(f"crop_min_side={c.crop_min_side} with latent_cache={c.latent_cache!r}: a cache stores one "
                          "crop per clip; set crop_min_side=0 to train from the cache")
    if is_remote(c.data_root):
        try:
            ObjectStore(c.data_root)
        except StorageError as error:
            raise ConfigError(f"data_root: {error}") from None
        c.sample_data = ""  # a profile's sample clips are made in local folders; a bucket is the user's data
        if c.latent_cache:
            raise ConfigError(f"latent_cache={c.latent_cache!r} with data_root={c.data_root!r}: the cache reads its clips "
                              "as local files; copy them to a local data_root, or set latent_cache='' to train from the store")
    if c.data_cache_gb < 0 or c.storage_retry_s <= 0:
        raise ConfigError(f"data_cache_gb={c.data_cache_gb} must be >= 0 and storage_retry_s={c.storage_retry_s} positive")
    if (is_remote(c.data_root) or is_remote(c.index_path)) and c.storage_retry_s > c.step_timeout_s / 2:
        # the rank waiting on the store reaches the step's agreement only when its retries end
        raise ConfigError(f"storage_retry_s={c.storage_retry_s:g} must be at most half of step_timeout_s={c.step_timeout_s}: "
                          "the other ranks would stop the job as if that rank were dead before the storage stop; lower "
                          "storage_retry_s or raise step_timeout_s")
    if c.decode_threads < 1:
        raise ConfigError(f"decode_threads={c.decode_threads} must be at least 1 (decoder threads per data worker)")
    if (c.compile or c.ref_vae_compile) and c.compile_backend not in COMPILE_BACKENDS:
        raise ConfigError(f"compile_backend={c.compile_backend!r}: choose one of {', '.join(COMPILE_BACKENDS)}")
    if c.ref_vae_compile and (not c.use_ref_vae or c.latent_cache):
        raise ConfigError(f"ref_vae_compile=true with {f'latent_cache={c.latent_cache!r}' if c.use_ref_vae else 'use_ref_vae=false'}: "
                          "no reference VAE encodes in this run; set ref_vae_compile=false")
    if c.seraena_buffer_gb <= 0:
        raise ConfigError(f"seraena_buffer_gb={c.seraena_buffer_gb} must be positive (host memory per rank for the replay buffer)")
    if not c.max_grad_norm >= 0:  # a negative norm would flip every gradient under DDP (NaN fails too)
        raise ConfigError(f"max_grad_norm={c.max_grad_norm} must be 0 (no clipping) or a positive gradient norm, e.g. 1.0")
    for key in (*WEIGHT_KEYS, "learning_rate"):
        if getattr(c, key) < 0:
            raise ConfigError(f"{key}={getattr(c, key)} must not be negative")
    check_schedules(c)
    reference_keys = [term.weight_key for term in LOSS_TERMS if term.needs_reference]
    if not c.use_ref_vae and any(getattr(c, key) > 0 for key in reference_keys):
        raise ConfigError(
            f"use_ref_vae=False (autoencoder mode) has no reference latents: set {' and '.join(f'{k}=0' for k in reference_keys)} "
            f"(got {' and '.join(str(getattr(c, key)) for key in reference_keys)})"
        )
    if c.supported_num_gpus and c.num_processes not in c.supported_num_gpus and not fits_by_accumulation(c):
        if c.accelerate_config.endswith("_cpu.yaml"):
            fits = f"NGPU {' or '.join(map(str, c.supported_num_gpus))} (CPU processes)"
        elif c.num_processes == 1:
            fits = "the profile 1gpu_h100 (one 80 GB GPU, H100 or A800 alike)"
        else:
            fits = ("the profile h100 (2 or more 80 GB GPUs: it keeps the global batch by accumulation), or a800 on "
                    "A800s")
        raise ConfigError(
            f"this profile is written for {' or '.join(map(str, c.supported_num_gpus))} process(es), got {c.num_processes}: "
            f"use {fits}, or a config file of your own (train_taehv_h100.sh N custom my_config.py, docs/launching.md)"
        )
    expected = c.batch_size_per_gpu * c.num_processes * c.gradient_accumulation_steps
    if c.global_batch_size not in (0, expected):
        raise ConfigError(
            f"global_batch_size={c.global_batch_size} but batch_size_per_gpu {c.batch_size_per_gpu} x processes "
            f"{c.num_processes} x gradient_accumulation_steps {c.gradient_accumulation_steps} = {expected}: make them agree"
        )
    for key in CAPPED_TO_MAX_STEPS:
        if getattr(c, key) > c.max_steps:
            raise ConfigError(f"{key}={getattr(c, key)} exceeds max_steps={c.max_steps}: lower it or raise max_steps")
    if not (ACCELERATE_CONFIG_DIR / c.accelerate_config).is_file():
        raise ConfigError(f"accelerate_config={c.accelerate_config!r}: no such file in {ACCELERATE_CONFIG_DIR}")
    if check_paths:
        check_required_paths(c)


def fits_by_accumulation(c: TrainConfig) -> bool:
    """A profile written for several processes, on another count of several: it trains there, its
    global batch kept by accumulation (load.py fit_process_count); one process is another profile."""
    written = c.supported_num_gpus
    return bool(written) and c.num_processes not in written and c.num_processes > 1 and 1 not in written


def check_schedules(c: TrainConfig) -> None:
    """The loss schedules: well formed, a discriminator that trains before its term reaches the
    student, and no part of the student idle at the stage's first step (DDP expects a gradient for
    every parameter in every step)."""
    for term in LOSS_TERMS:
        value = getattr(c, term.schedule_key)
        if value and (len(value) != 2 or value[0] < 0 or value[1] < 0):
            raise ConfigError(f"{term.schedule_key}={value!r}: expected (start_step, ramp_steps), both >= 0, "
                              f"e.g. {term.schedule_key}=20000,1000, or () for the full weight from step 0")
    if c.discriminator_start_step < -1:
        raise ConfigError(f"discriminator_start_step={c.discriminator_start_step}: use a step >= 0, or -1 (with its term)")
    seraena_start = schedule(c, TERMS_BY_NAME["seraena"])[0]
    if c.seraena_weight > 0 and discriminator_start(c) > seraena_start:
        raise ConfigError(f"discriminator_start_step={c.discriminator_start_step} is after the seraena term's start "
                          f"{seraena_start} (seraena_schedule): the student would learn from an untrained "
                          f"discriminator; start the discriminator at or before {seraena_start}, or -1")
    if c.adaptive_weight_max <= 0 or c.discriminator_collapse_steps < 0:
        raise ConfigError(f"adaptive_weight_max={c.adaptive_weight_max:g} must be positive and discriminator_collapse_steps="
                          f"{c.discriminator_collapse_steps} >= 0")
    if not any(getattr(c, key) for key in (t.schedule_key for t in LOSS_TERMS)):
        return
    everything, first = student_needs(c), student_needs(c, at_step=0)
    decodes = lambda needs: needs.roundtrip or needs.reference_decode  # noqa: E731
    for part, idle in (("encoder", everything.encode and not first.encode),
                       ("decoder", decodes(everything) and not decodes(first))):
        if idle:
            late = [f"{t.schedule_key}={getattr(c, t.schedule_key)}" for t in LOSS_TERMS if getattr(c, t.schedule_key)]
            raise ConfigError(f"no loss term trains the {part} at this stage's first step ({', '.join(late)}): start "
                              f"one term that reads it at step {c.schedule_offset} (an empty schedule), or train the "
                              f"{part} in a stage of its own")
