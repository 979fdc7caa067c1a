"""The training loop, started by training/taehv_train.py. Reads like a table of contents:

    main: build_run (config, run folder, data, reference VAE, latent space, accelerator, model,
          optimizer, resume) -> train (micro-steps of training/loop/step.py; each interval's owner
          says whether a step is its own: log, validation, checkpoint) -> finish (the export)

Every way a rank ends maps to one exit code in one place: STARTUP_FAILURES before training,
stopped() during it (2 config, 3 data or a stop the run decided, 4 another rank gone), and
STOPPED_BY_SIGNAL after a checkpoint on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from models.cpu_bf16 import bf16_convolutions
from models.variants import export_file_names
from training.base.agreement import agree
from training.base.failures import die_with_launcher, is_collective_timeout, is_peer_gone, set_collective_timeout
from training.base.launch import STOPPED_BY_SIGNAL
from training.base.run_log import RunLog, start_profiler
from training.base.storage import StorageUnavailable
from training.base.unwrap import unwrap
from training.config.schema import ConfigError, TrainConfig, error_line
from training.config.views import student_of
from training.data.clips import DataFailureError, FailureTracker
from training.data.index import IndexFormatError
from training.loop.batches import loader_batches
from training.loop.build import (
    build_accelerator,
    build_datasets,
    build_lpips,
    build_model,
    build_reference_vae,
    build_seraena,
    build_train_loader,
    check_deepspeed_batch,
    check_finiteness_once,
    choose_sample_data,
    configure_compile,
    configure_cuda,
)
from training.loop.checkpoints import check_run_folder, checkpoint_due, resume, save_checkpoint
from training.loop.exports import current_weights, export_info, export_model
from training.loop.recovery import StoppedInsideACollective, TrainingStopped, note_bad_step, shorten_collective_timeout
from training.loop.report import CompileTime, log_due, log_training
from training.loop.fault_injection import FaultInjection
from training.loop.state import TrainingRun
from training.loop.step import train_step
from training.loop.validation import (evaluation_model, validation_due, record_validation, validate, validation_line,
                                      warm_up_validation, with_baseline)
from training.run.checkpoint_files import complete_checkpoints
from training.run.folder import Run, load_run, record_run
from training.step.ema import PartitionedEMA, WeightEMA
from training.step.optimizer import build_optimizer, set_peak_learning_rate, state_in_parameter_layout
from training.step.weights import full_state_dict, weights_fingerprint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train TAEHV (started by train_taehv_h100.sh).")
    parser.add_argument("--config", required=True, help="profile name or path of a .py config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output-dir", help="the run folder (overrides output_dir)")
    parser.add_argument("--resume", help="checkpoint folder; 'latest' = newest complete one of the run (error if none); "
                        "'auto' = latest if any, else start fresh (for restarted jobs)")
    parser.add_argument("--max-steps", type=int, help="shorthand for --set max_steps=N")
    parser.add_argument("--torch-profile", action="store_true", help="trace a few steps into <run>/profile/")
    return parser.parse_args(argv)


def load_run_config(args: argparse.Namespace) -> Run:
    """This launch's config and run folder; on a resume of a recorded run, the run's own settings
    (training/run/folder.py)."""
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"max_steps={args.max_steps}")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not args.output_dir:
        raise ConfigError("several processes need one run folder: pass --output-dir (the launchers do)")
    return load_run(args.config, overrides, num_processes=world_size, output_dir=args.output_dir or "",
                    resume=args.resume or "")


class ReferenceVAEError(RuntimeError):
    """The reference VAE could not load."""


class LatentSpaceError(RuntimeError):
    """The starting weights are clearly in another latent space than the run learns."""


# How a refusal before training ends every rank: (error types, exit code, line prefix). The
# launchers explain 2 (config: a key, value or input) and 3 (data) with the rank's one line.
STARTUP_FAILURES = (
    ((ConfigError,), 2, ""),
    ((ReferenceVAEError,), 2, "reference VAE error: "),
    ((LatentSpaceError,), 2, "latent space error: "),
    ((DataFailureError, IndexFormatError, StorageUnavailable), 3, "data error: "),
)
REFUSALS = tuple(kind for kinds, _, _ in STARTUP_FAILURES for kind in kinds)


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()
    args = parse_args(argv)
    try:
        run = build_run(args)
    except REFUSALS as error:
        code, prefix = next((code, prefix) for kinds, code, prefix in STARTUP_FAILURES if isinstance(error, kinds))
        return fail(code, prefix + (error_line(error) if isinstance(error, ConfigError) else str(error)))
    with convolutions_of(run):
        try:
            train(run)
        except (DataFailureError, TrainingStopped, RuntimeError) as error:
            return stopped(run, error)
        if run.stop.agreed:
            run.accelerator.end_training()
            if run.accelerator.is_main_process:  # tells the launcher this stop was handled (see train_taehv_h100.sh)
                (run.run_dir / "STOPPED_CLEANLY").write_text(f"checkpoint-{run.progress.step}\n")
            return STOPPED_BY_SIGNAL  # preempted: the checkpoint is written; --resume latest continues
        return finish(run)


def convolutions_of(run: TrainingRun):
    """A bf16 run on a CPU without bf16 instructions computes its convolutions in fp32 from the bf16
    values and writes bf16, as CUDA's kernels do, instead of PyTorch's naive bf16 path (8x slower:
    models/cpu_bf16.py). Not under torch.compile, which traces the ops themselves."""
    if run.config.compile or run.config.ref_vae_compile:
        return contextlib.nullcontext()
    return bf16_convolutions(run.accelerator.device, torch.bfloat16 if run.config.mixed_precision == "bf16" else torch.float32)


def build_run(args: argparse.Namespace) -> TrainingRun:
    """The run, built in the order that refuses cheaply first: config and run folder (nothing
    written yet), data (before process groups, DeepSpeed and the model), the reference VAE and the
    starting weights' latent space; only then the run folder, the accelerator and the model."""
    launch = load_run_config(args)
    config, run_dir, resume_from = launch.config, launch.run_dir, launch.resume_from
    if config.accelerate_config.endswith("_cpu.yaml"):  # a CPU profile runs on the CPU wherever it runs,
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # launched directly too (CUDA reads this when it starts)
    check_run_folder(config, resume_from, resuming=bool(args.resume))
    choose_sample_data(config)  # before resolved_config.json is written: it records the folder trained on

    from accelerate.utils import set_seed

    configure_cuda(config)
    faults = FaultInjection.from_environment()  # tests and soak runs only: installed on the built run below
    train_dataset, validation_dataset = build_datasets(config, run_dir)
    rank = int(os.environ.get("RANK", "0"))  # what accelerate's process_index will be
    loader, sampler = build_train_loader(config, faults.wrap_dataset(train_dataset), rank, config.num_processes)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else torch.device("cpu")
    try:
        reference_vae = build_reference_vae(config, device)
    except RuntimeError as error:
        raise ReferenceVAEError(str(error)) from error
    latent_space_report, problem = check_starting_latent_space(config, reference_vae, validation_dataset)
    if problem:
        raise LatentSpaceError(problem)
    configure_compile(config, reference_vae)  # before anything compiles, after the checks' own encodes
    if rank == 0:  # the inputs passed: only now does the run folder get written
        record_run(launch)
        if latent_space_report is not None:
            (run_dir / "latent_space_check.json").write_text(json.dumps(latent_space_report, indent=2) + "\n")
    accelerator = build_accelerator(config, run_dir)
    set_seed(config.seed)  # the same initial weights on every rank
    model = build_model(config)
    set_seed(config.seed, device_specific=True)  # per-rank randomness from here on
    optimizer, scheduler = build_optimizer(config, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    set_collective_timeout(config.nccl_timeout_s)  # DeepSpeed's groups too, until the first step shortens it
    check_deepspeed_batch(accelerator, config)
    if accelerator.state.deepspeed_plugin is not None:
        check_finiteness_once(model)
    run = TrainingRun(
        config=config, run_dir=run_dir, accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler,
        ema=build_ema(config, accelerator, model),
        seraena=build_seraena(config, accelerator, unwrap(accelerator, model).taehv),
        reference_vae=reference_vae, lpips=build_lpips(config, accelerator.device),
        loader=loader, sampler=sampler, validation_dataset=validation_dataset,
        failures=FailureTracker(config.max_failed_fraction),
        log=RunLog(run_dir, accelerator.is_main_process),
    )
    faults.install(run)
    accelerator.init_trackers("taehv")
    if run.lpips is None:
        run.log.line("LPIPS weights not found: validation reports PSNR and SSIM only (see docs/evaluation.md)")
    run.log.line(f"run folder {run_dir} | {accelerator.num_processes} processes | ZeRO {config.zero_stage}{engine_note(model)} | "
                 f"global batch {config.global_batch_size} | {len(train_dataset)} train / {len(validation_dataset)} "
                 f"validation clips | {describe_teacher(config)}")
    for line in launch.change_lines():  # recorded in resolved_config.json (the previous one kept beside it)
        run.log.line(line)
    if resume_from is not None:
        resume(run, resume_from)
        state_in_parameter_layout(run.optimizer)
        set_peak_learning_rate(run.scheduler, config.learning_rate)
    run.profiler = start_profiler(run_dir, accelerator.process_index) if args.torch_profile else None
    run.stop.install()
    return run


def stopped(run: TrainingRun, error: BaseException) -> int:
    """How a failure during training ends this rank: 3 for a stop the run decided (too many bad
    steps, broken data, lost storage, a full /dev/shm), 4 when another rank left or stopped
    answering. Anything else is a bug and raises with its traceback. Each prints one line."""
    accelerator, config = run.accelerator, run.config
    latest = complete_checkpoints(run.run_dir)
    last = f"the last checkpoint is {latest[-1] if latest else 'none'}"
    if isinstance(error, (DataFailureError, TrainingStopped)):
        run.log.line(f"stopped: {error}")
        print(f"stopped on rank {accelerator.process_index}: {error}", file=sys.stderr, flush=True)
        return leave_broken_collectives(accelerator, 3) if isinstance(error, StoppedInsideACollective) else 3
    if is_peer_gone(error):  # the rank that left printed why; this one adds no traceback
        print(f"stopped on rank {accelerator.process_index}: a collective broke at step {run.progress.step + 1} because "
              f"another rank left the job (its own message above says why); {last}: --resume latest continues from it",
              file=sys.stderr, flush=True)
        return leave_broken_collectives(accelerator, 4)
    if is_collective_timeout(error):
        timeout = f"step_timeout_s={config.step_timeout_s}" if run.step_timeout_set else f"nccl_timeout_s={config.nccl_timeout_s}"
        print(f"stopped on rank {accelerator.process_index}: a collective did not complete within {timeout} s at step "
              f"{run.progress.step + 1}: another rank stopped answering (stuck, stopped or dead; its own output says "
              f"why); {last}: fix that rank, then --resume latest", file=sys.stderr, flush=True)
        return 4
    raise error


def leave_broken_collectives(accelerator, code: int) -> int:
    """Exit now with `code`, its lines already printed: tearing down a process group or DDP reducer
    left mid-collective can abort the process (SIGABRT from a C++ destructor), which would replace
    the exit code and the one-line reason with a crash report. TensorBoard's last scalars are
    written first (no collective in that)."""
    if accelerator.is_main_process:
        try:
            accelerator.get_tracker("tensorboard", unwrap=True).flush()
        except Exception:  # no tracker yet: nothing to keep
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def check_starting_latent_space(config: TrainConfig, reference_vae, validation_dataset) -> tuple[dict | None, str]:
    """The starting weights against the reference on up to 4 held-out clips (the same on every
    rank, so every rank decides alike without a collective): (the report for
    <run>/latent_space_check.json, the refusal or ''), with one summary line from rank 0."""
    if not (config.latent_space_check and config.pretrained_model_path and reference_vae is not None):
        return None, ""
    from models.taehv import TAEHV
    from training.loop.latent_space_check import latent_space_problem, latent_space_report, summary_line

    device = reference_vae.shift.device
    student = TAEHV.from_pretrained(config.pretrained_model_path, variant=student_of(config).variant).to(device).eval()
    videos = [validation_dataset[i]["video"][None].to(device).float() / 255 for i in range(min(4, len(validation_dataset)))]
    report = latent_space_report(student, reference_vae, videos)
    if int(os.environ.get("RANK", "0")) == 0:
        print(summary_line(report), flush=True)
    return report, latent_space_problem(report)


def fail(code: int, line: str) -> int:
    """A one-line start-up error, the same on every rank, with its exit code (2 config, 3 data).
    Under the launchers' agent (training/base/launch.py) each rank leaves it there and the agent prints
    the lowest rank's once: a rank terminated before it could print cannot lose it. Run directly,
    the first rank of each machine prints it."""
    from training.base.launch import ERROR_DIR

    if os.environ.get(ERROR_DIR) and Path(os.environ[ERROR_DIR]).is_dir():
        (Path(os.environ[ERROR_DIR]) / f"rank-{os.environ.get('RANK', '0')}.txt").write_text(line + "\n")
    elif int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(line, file=sys.stderr, flush=True)
    return code


def build_ema(config: TrainConfig, accelerator, model):
    """ZeRO-1/2 average their own partition's fp32 masters (no collective per step); DDP averages
    its own parameters; ZeRO-3, whose parameters are partitioned too, gathers them each step."""
    if config.ema_decay <= 0:
        return None
    weights = full_state_dict(accelerator, model)
    if config.zero_stage in (1, 2):
        return PartitionedEMA(weights, config.ema_decay, accelerator.device, unwrap(accelerator, model))
    return WeightEMA(weights, config.ema_decay, accelerator.device)


def engine_note(model) -> str:
    """What wraps the student: under DeepSpeed, what its optimizer sums gradients in, as the engine
    holds it (training/loop/build.py asks fp32 for bf16 engines); else DDP, or nothing for one process
    (DDP accumulates in the parameters' fp32)."""
    optimizer = getattr(model, "optimizer", None)
    dtype = getattr(optimizer, "gradient_accumulation_dtype", None)
    if dtype is not None:
        checked = "; inf/NaN skipped on the device by the fused AdamW's found_inf" if "scaled_global_norm" in vars(optimizer) else ""
        return f" (gradients accumulated in {str(dtype).removeprefix('torch.')}{checked})"
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return " (DDP)"
    return "" if hasattr(model, "optimizer") else " (one process: no DDP)"


def describe_teacher(config: TrainConfig) -> str:
    if not config.use_ref_vae:
        return "autoencoder mode"
    return f"distilling from {config.reference_family}" + (f" (latents from the cache {config.latent_cache})" if config.latent_cache else "")


def note_discriminator_reset(run: TrainingRun) -> None:
    """A discriminator failing for discriminator_collapse_steps in a row starts over (checked at log
    steps, which sync anyway; every rank decides alike on the averaged loss)."""
    if run.seraena is None:
        return
    failed = run.seraena.reset_if_failing(run.config.discriminator_collapse_steps)
    if failed:
        run.log.line(f"Seraena's discriminator loss was non-finite or below 1e-3 (collapsed) for {failed} optimizer "
                     f"steps in a row: its weights and optimizer were reset to their initial values (reset "
                     f"{run.seraena.resets}; discriminator_collapse_steps={run.config.discriminator_collapse_steps})")
    run.accelerator.log({"train/seraena_discriminator_resets": run.seraena.resets}, step=run.progress.step)


def train(run: TrainingRun) -> None:
    """Optimizer steps until max_steps (or early stopping), with logging, validation and
    checkpoints at their intervals."""
    config, accelerator, progress = run.config, run.accelerator, run.progress
    last_log_time, data_wait, window = time.perf_counter(), 0.0, []
    compile_time = CompileTime(run)  # says nothing unless something compiles
    bar = None
    if accelerator.is_main_process and sys.stdout.isatty():
        from tqdm import tqdm

        bar = tqdm(total=config.max_steps, initial=progress.step, unit="step", dynamic_ncols=True)
    warm_up_validation(run)  # validation's shapes tuned now, not at the first validation (the step's: its first micro-step)
    while progress.step < config.max_steps:
        # exact resume: the data position follows the batches drawn, skipped ones included
        run.sampler.set_position(*divmod(progress.micro_step, run.sampler.batches_per_epoch))
        fetch_start = time.perf_counter()
        for batch in loader_batches(run):  # None: a data worker died and took its batch
            data_wait += time.perf_counter() - fetch_start
            if batch is not None:
                run.failures.update(batch["skipped"], len(batch["video"]))
            progress.micro_step += 1
            step_start = time.perf_counter()
            logged, skip_reason, where = train_step(run, batch)
            compile_time.add(time.perf_counter() - step_start)
            if logged is None:
                if skip_reason:  # "" when only this rank knows yet (a backward out of memory)
                    note_bad_step(run, skip_reason, where)
                fetch_start = time.perf_counter()
                continue
            run.consecutive_bad_steps = 0
            window.append(logged)
            if not accelerator.sync_gradients:
                fetch_start = time.perf_counter()
                continue
            progress.step += 1
            step = progress.step
            if not run.step_timeout_set:
                shorten_collective_timeout(run)
            if run.ema is not None:
                run.ema.step(accelerator, run.model)
            if run.profiler is not None:
                run.profiler.step()
            if bar is not None:
                bar.update(1)
            if log_due(config, step):
                note_discriminator_reset(run)
                elapsed = time.perf_counter() - last_log_time
                log_training(run, window, elapsed, data_wait)
                compile_time.report(run.log)
                last_log_time, data_wait, window = time.perf_counter(), 0.0, []
            if validation_due(config, step):
                validation_start = time.perf_counter()
                run.last_metrics = with_baseline(run, validate(run, evaluation_model(run)))
                accelerator.log({f"val/{k}": v for k, v in run.last_metrics.items()}, step=step)
                run.log.line(validation_line(step, run.last_metrics, time.perf_counter() - validation_start))
                run.stopped_early = record_validation(run, run.last_metrics)
            if checkpoint_due(run, step):
                saved = save_checkpoint(run, step)
                if saved is not None:
                    run.log.line(f"checkpoint {saved}")
            if run.stop.agreed:
                if saved is None:
                    raise TrainingStopped(f"stop requested (SIGTERM/SIGINT) but the checkpoint of step {step} could not be "
                                          "written; --resume latest continues from the previous one")
                run.log.line(f"stop requested (SIGTERM/SIGINT): checkpoint at step {step} written, exiting")
                return
            if step >= config.max_steps or run.stopped_early:
                break
            fetch_start = time.perf_counter()
        if run.stopped_early:
            break
    if run.profiler is not None:
        run.profiler.stop()
    if bar is not None:
        bar.close()


def finish(run: TrainingRun) -> int:
    """Export the validated weights (EMA when enabled) in the public format; 3 when a rank could
    not write them (all ranks agree, the last checkpoint stays the way to export again)."""
    accelerator = run.accelerator
    if not run.last_metrics:  # resumed at max_steps (a finished or nearly finished run): measure what is exported
        run.last_metrics = with_baseline(run, validate(run, evaluation_model(run)))
    weights = {k: v.detach().float().cpu() for k, v in current_weights(run).items()}
    taehv = unwrap(accelerator, run.model).taehv
    error = ""
    try:
        if accelerator.is_main_process:
            run.seams.fire("file_write", "final", run.progress.step)
        export_model(accelerator, weights, taehv, run.run_dir / "final", run.progress.step, run.last_metrics,
                     **export_info(run.config))
    except OSError as failure:
        error = str(failure)
    failed = agree(accelerator, failed=bool(error))
    if failed:  # the last checkpoint is complete: a resume at max_steps exports again
        latest = complete_checkpoints(run.run_dir)
        message = (f"the export to {run.run_dir / 'final'} failed {failed.where('failed')}: {error or 'that rank says why'}; "
                   f"the checkpoint {latest[-1].name if latest else '(none)'} is complete: free space, then --resume latest exports")
        run.log.line(f"stopped: {message}")
        print(f"stopped on rank {accelerator.process_index}: {message}", file=sys.stderr, flush=True)
        return 3
    print(f"rank {accelerator.process_index} of {accelerator.num_processes}: final weights fingerprint "
          f"{weights_fingerprint(weights)}", flush=True)
    if run.seraena is not None:
        discriminator = {k: v.detach().float().cpu() for k, v in run.seraena.seraena.state_dict().items()}
        print(f"rank {accelerator.process_index} of {accelerator.num_processes}: seraena fingerprint "
              f"{weights_fingerprint(discriminator)}", flush=True)
    scored = f"validation PSNR {run.last_metrics['psnr']:.2f} dB" if "psnr" in run.last_metrics else "no clip scored"
    run.log.line(f"done at step {run.progress.step}: exported {run.run_dir / 'final'} ({scored})")
    run.log.line(f"run folder {run.run_dir}: train.log, logs/ (tensorboard --logdir {run.run_dir / 'logs'}), "
                 f"checkpoints/, validation_history.json, best_model/, final/{' + '.join(export_file_names(taehv.args.variant))} "
                 "(named as the public files are: upstream's taehv.py builds the architecture from the name)")
    run.log.line(f"evaluate: python inference.py --model {run.run_dir} --held-out-of {run.run_dir} (or --videos <clips>) "
                 f"--frames {run.config.n_frames} --height {run.config.height} --width {run.config.width} --out <folder> "
                 + (f"--ref-vae-path {run.config.ref_vae_path} " if run.config.use_ref_vae else "") + "(docs/howto/evaluate.md)")
    accelerator.end_training()
    if accelerator.is_main_process:  # tells the launcher the run ended on its own (see train_taehv_h100.sh)
        (run.run_dir / "FINISHED").write_text(f"step {run.progress.step}\n")
    return 0
