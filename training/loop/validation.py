"""Validation: metrics of the weights that are exported (the EMA when enabled) on the held-out
clips, the validation line, validation_history.json, best_model/ and early stopping."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import torch

from models.metrics import MIN_SOURCE_COLOURFULNESS
from models.taehv import TAEHV
from training.base.unwrap import unwrap
from training.config.views import decoded_frame_count, student_of
from training.loop.exports import current_weights, export_info, export_model
from training.loop.step import reference_latents_for
from training.step.losses import aligned, generators_kept

if TYPE_CHECKING:
    from training.loop.state import TrainingRun


LOWER_IS_BETTER = ("lpips", "flicker", "warping_error")  # best_metric values (and their decode_ forms) where smaller wins
# colour and motion (models/metrics.py); the validation line prints them after the PSNR by frame, in this order
COLOUR_AND_MOTION = ("warping_error", "colourfulness_ratio", "luma_psnr", "chroma_psnr")
_reported_missing_opencv = False  # the one-time log line when OpenCV is missing
_named_clips: set[str] = set()  # validation clips already named for non-finite reference latents (once each)


SAMPLE_CLIPS = 2  # held-out clips shown in TensorBoard at each validation


def validation_due(config, step: int) -> bool:
    """Whether optimizer step `step` is validated (the last step always is)."""
    return step % config.validation_steps == 0 or step == config.max_steps


def evaluation_model(run: TrainingRun) -> TAEHV:
    """A plain fp32 TAEHV holding the weights that are validated and exported."""
    evaluated = TAEHV.from_args(unwrap(run.accelerator, run.model).taehv.args)
    evaluated.load_state_dict({k: v.float().cpu() for k, v in current_weights(run).items()})
    return evaluated.to(run.accelerator.device).eval()


def warping_available(run: TrainingRun) -> bool:
    """Whether OpenCV (for the warping error) imports; when not, one log line says so, once."""
    global _reported_missing_opencv
    from models.metrics import opencv_missing

    missing = opencv_missing()
    if missing and not _reported_missing_opencv:
        _reported_missing_opencv = True
        run.log.line(f"validation: warping_error is not measured: {missing}")
    return missing is None


def warm_up_validation(run: TrainingRun) -> None:
    """cuDNN's tuning (cudnn.benchmark) of validation's shapes before step 1: each convolution shape
    is timed at its first use, so the held-out batch, each of validation_sizes and the metrics' own
    convolutions (SSIM's window, LPIPS) would be tuned at the first validation, mid-run. Runs validate's
    work once on this rank's first batch and first clip at each size (validate(warming=True)), on a
    fresh evaluation model (the values do not matter, its class, dtype and shapes do; the starting
    weights' baseline is the same class), nothing reduced, logged or kept. No collective."""
    if not torch.backends.cudnn.benchmark:
        return
    with generators_kept(run.accelerator.device):  # a reference VAE sampling its latents draws nothing of the run's
        evaluated = TAEHV.from_args(unwrap(run.accelerator, run.model).taehv.args)
        validate(run, evaluated.to(run.accelerator.device).eval(), warming=True)


def validate(run: TrainingRun, evaluated: TAEHV, warming: bool = False) -> dict:
    """PSNR, SSIM, LPIPS (when its weights are on this machine), flicker (when two or more frames
    are decoded), luma and chroma PSNR, the colourfulness ratio (mean colourfulness of the
    reconstructions over that of the inputs) and the warping error (two or more frames, OpenCV; on
    the CPU, cheap at validation's clip counts) of the round trip over the held-out clips, and of
    the student's decode of reference latents when distilling; clips are split across ranks and the
    sums reduced. A clip whose reference latents are not finite (a bf16 overflow of the reference
    VAE) stays out of every metric, is counted (skipped_clips, in the same reduce: no rank waits on
    another) and named once; when every clip is skipped the result is skipped_clips alone, no metric.
    Each rank runs validation_batch_size clips at a time, in the step's precision
    (bf16 autocast under a bf16 run on a GPU; the metrics in fp32). Rank 0 sends its first clips to
    TensorBoard. warming: this rank's first batch only (warm_up_validation), every clip kept, nothing
    reduced, logged or returned."""
    from models.metrics import chroma_psnr, colourfulness, flicker, luma_psnr, psnr, source_warps, ssim, warping_error

    accelerator, dataset = run.accelerator, run.validation_dataset
    precision = torch.autocast(accelerator.device.type, torch.bfloat16,
                               enabled=run.config.mixed_precision == "bf16" and accelerator.device.type == "cuda")
    count = min(run.config.validation_samples, len(dataset))
    temporal = decoded_frame_count(run.config) >= 2  # flicker compares consecutive frames
    warping = temporal and not warming and warping_available(run)  # OpenCV's flow, on the CPU: nothing to tune
    metrics = ("psnr", "ssim") + (("lpips",) if run.lpips is not None else ()) + (("flicker",) if temporal else ())
    # sums whose ratios are reported: colourfulness of both, the warping error over the clips that have one
    metrics += ("luma_psnr", "chroma_psnr", "colourfulness", "source_colourfulness")
    metrics += ("warping_error", "warped_clips") if warping else ()
    prefixes = ("", "decode_")[: 2 if run.config.use_ref_vae else 1]
    names = [f"{prefix}{metric}" for prefix in prefixes for metric in metrics]
    # PSNR of the round trip by frame position: an untrained temporal slot shows as one low position
    names += [f"psnr_frame{t}" for t in range(decoded_frame_count(run.config))]
    totals = torch.zeros(len(names) + 2, device=accelerator.device)  # metric sums, number of clips, skipped clips
    skipped: list[str] = []  # this rank's clips with non-finite reference latents
    own = list(range(accelerator.process_index, count, accelerator.num_processes))
    # no larger than the most clips one rank holds: no more repeats to fill up than needed
    size = max(1, min(run.config.validation_batch_size, -(-count // accelerator.num_processes)))
    with torch.no_grad():  # a plain module: ranks need not run the same number of forwards
        for indices in [own[i : i + size] for i in range(0, len(own), size)][: 1 if warming else None]:
            items = [dataset[index] for index in indices]
            # a short batch is filled up with repeats of its first clip, left out of every sum: the models
            # see one shape, which cuDNN's autotuning times once (docs/performance.md#cudnn-autotuning)
            items += items[:1] * (size - len(items))
            batch = {key: torch.stack([item[key] for item in items]) for key in ("video", "latents") if key in items[0]}
            video = batch["video"].to(accelerator.device).float() / 255
            reference_latents = reference_latents_for(run, batch, video, check=False) if run.config.use_ref_vae else None
            if reference_latents is not None and not warming:  # a non-finite clip is left out here, never raised: ranks stay in step
                finite = reference_latents[: len(indices)].flatten(1).isfinite().all(1).tolist()
                if not all(finite):
                    skipped += [clip_name(dataset, items[row], indices[row]) for row, ok in enumerate(finite) if not ok]
                    totals[-1] += finite.count(False)
                    kept = [row for row, ok in enumerate(finite) if ok]
                    rows = kept + kept[:1] * (size - len(kept))  # filled up again: the same shape
                    indices, video, reference_latents = [indices[row] for row in kept], video[rows], reference_latents[rows]
                    if not kept:
                        continue
            with precision:  # the student's precision; the reference VAE keeps its own
                decoded = {"": evaluated(video)}
                if reference_latents is not None:
                    decoded["decode_"] = evaluated.decode_video(reference_latents)
            decoded = {prefix: frames.float() for prefix, frames in decoded.items()}
            values, warps = {}, {}
            for prefix, frames in decoded.items():
                target = aligned(video, frames)
                values[prefix + "psnr"], values[prefix + "ssim"] = psnr(frames, target), ssim(frames, target)
                if run.lpips is not None:
                    values[prefix + "lpips"] = run.lpips(frames, target)
                if temporal:
                    values[prefix + "flicker"] = flicker(frames, target)
                values[prefix + "luma_psnr"], values[prefix + "chroma_psnr"] = luma_psnr(frames, target), chroma_psnr(frames, target)
                values[prefix + "colourfulness"], values[prefix + "source_colourfulness"] = colourfulness(frames), colourfulness(target)
                if warping:  # the source's flow once per frame count, shared by both prefixes
                    if frames.shape[1] not in warps:
                        warps[frames.shape[1]] = source_warps(target)
                    per_clip = warping_error(frames, target, warps=warps[frames.shape[1]]).to(video.device)
                    values[prefix + "warping_error"] = per_clip.nan_to_num(0.0)
                    values[prefix + "warped_clips"] = per_clip.isfinite().float()
            frames, target = decoded[""], aligned(video, decoded[""])
            for t in range(frames.shape[1]):
                values[f"psnr_frame{t}"] = psnr(frames[:, t], target[:, t])
            totals[:-1] += torch.cat([torch.stack([values[n].float()[: len(indices)].sum() for n in names]), totals.new_full((1,), len(indices))])
            for row, index in enumerate(indices):
                if index < SAMPLE_CLIPS * accelerator.num_processes and not warming:  # rank 0's first clips go to TensorBoard
                    log_sample_image(run, video[row : row + 1], decoded[""][row : row + 1], index // accelerator.num_processes)
    if warming:
        validate_at_sizes(run, evaluated, warming=True)
        return {}
    totals = accelerator.reduce(totals, reduction="sum") if accelerator.num_processes > 1 else totals
    sums = {name: totals[i].item() for i, name in enumerate(names)}
    clips, skipped_clips = totals[-2].item(), int(totals[-1].item())
    if skipped_clips:  # every rank knows from the reduce, so every rank enters this gather
        name_skipped_clips(run, skipped, scored_none=not clips)
    if not clips:  # a mean over no clip is NaN, and a NaN best is never beaten: no metric at all
        return {"skipped_clips": skipped_clips}
    out = {name: sums[name] / clips for name in names if not name.endswith(("colourfulness", "warping_error", "warped_clips"))
           and not name.startswith("psnr_frame")}
    for prefix in prefixes:  # ratios of sums: a grey clip or one without agreeing flow leaves no hole
        source = sums[f"{prefix}source_colourfulness"] / clips
        if source >= MIN_SOURCE_COLOURFULNESS:
            out[f"{prefix}colourfulness_ratio"] = sums[f"{prefix}colourfulness"] / sums[f"{prefix}source_colourfulness"]
        if sums.get(f"{prefix}warped_clips"):
            out[f"{prefix}warping_error"] = sums[f"{prefix}warping_error"] / sums[f"{prefix}warped_clips"]
    out.update({name: sums[name] / clips for name in names if name.startswith("psnr_frame")})
    out.update(validate_at_sizes(run, evaluated))
    return {**out, "skipped_clips": skipped_clips} if skipped_clips else out


def validate_at_sizes(run: TrainingRun, evaluated: TAEHV, warming: bool = False) -> dict:
    """At each of validation_sizes, the same held-out clips cut to that size: `<H>x<W>_psnr`,
    `_chroma_psnr` and `_colourfulness_ratio` of the round trip, and the same of the 8x8 block
    average (`<H>x<W>_block_average_...`), the blur a model should beat. The student is fully
    convolutional, so a user runs it at sizes it never trained at; this shows what they see. Clips
    are split across ranks, one at a time, and the sums reduced; no reference latents (autoencoder
    round trip only). warming: this rank's first clip only, nothing reduced or returned."""
    from models.metrics import block_average, chroma_psnr, colourfulness, psnr

    accelerator, config = run.accelerator, run.config
    count = min(config.validation_samples, len(run.validation_dataset))
    own = range(accelerator.process_index, count, accelerator.num_processes)[: 1 if warming else None]
    precision = torch.autocast(accelerator.device.type, torch.bfloat16,
                               enabled=config.mixed_precision == "bf16" and accelerator.device.type == "cuda")
    out = {}
    for height, width in config.validation_sizes:
        dataset = run.validation_dataset.at_size(height, width)
        # per reconstruction (model, block average): PSNR, chroma PSNR, colourfulness; then the source's, the clips
        totals = torch.zeros(8, device=accelerator.device)
        with torch.no_grad():
            for index in own:
                video = dataset[index]["video"][None].to(accelerator.device).float() / 255
                with precision:
                    frames = evaluated(video).float()
                target = aligned(video, frames)
                values = []
                for reconstruction in (frames, block_average(target)):
                    values += [psnr(reconstruction, target), chroma_psnr(reconstruction, target), colourfulness(reconstruction)]
                totals += torch.cat([*values, colourfulness(target), totals.new_ones(1)])
        if warming:
            continue
        totals = accelerator.reduce(totals, reduction="sum") if accelerator.num_processes > 1 else totals
        sums = totals.tolist()
        clips, source = sums[7], sums[6]
        if not clips:
            continue
        for prefix, (psnr_sum, chroma_sum, colour_sum) in ((f"{height}x{width}_", sums[0:3]),
                                                          (f"{height}x{width}_block_average_", sums[3:6])):
            out[prefix + "psnr"], out[prefix + "chroma_psnr"] = psnr_sum / clips, chroma_sum / clips
            if source / clips >= MIN_SOURCE_COLOURFULNESS:  # a grey source has no ratio
                out[prefix + "colourfulness_ratio"] = colour_sum / source
    return out


def clip_name(dataset, item: dict, index: int) -> str:
    """The clip's path under data_root (a cached sample's record holds it), else its position."""
    if "recipe" in item:
        return item["recipe"]["clip"]
    return dataset.record(index)["clip"] if hasattr(dataset, "record") else f"validation sample {index}"


def name_skipped_clips(run: TrainingRun, skipped: list[str], scored_none: bool = False) -> None:
    """Rank 0 names, once per clip, each rank's validation clips with non-finite reference latents
    (a collective: every rank calls it when the reduced count is not zero); when no clip was scored,
    one line names them all, at every such validation."""
    accelerator = run.accelerator
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        seen = gather_object([(accelerator.process_index, name) for name in skipped])
    else:
        seen = [(0, name) for name in skipped]
    cause = (run.reference_vae.nonfinite_message() if run.reference_vae is not None
             else f"non-finite latents in latent_cache={run.config.latent_cache} (rebuild it with scripts/cache_latents.py)")
    if scored_none:
        _named_clips.update(name for _, name in seen)
        clips = ", ".join(f"{name} (rank {rank})" for rank, name in seen)
        run.log.line(f"validation scored no clip: every held-out clip was skipped ({clips}): {cause}; "
                     "no metric this time, best_model/ and early stopping stay as they were")
        return
    for rank, name in seen:
        if name not in _named_clips:
            _named_clips.add(name)
            run.log.line(f"validation clip {name} (rank {rank}) skipped: {cause}; it stays out of the validation "
                         "metrics at every validation, counted as skipped_clips")


COMPARED_METRICS = ("psnr", "ssim", "lpips", "decode_psnr", "decode_ssim", "decode_lpips", "flicker")


def with_baseline(run: TrainingRun, metrics: dict) -> dict:
    """When the run started from pretrained_model_path: the metrics plus `<metric>_vs_start`, the
    change against those starting weights, scored on the same clips at the first validation that
    scores any (kept in Progress, so a resumed run compares with the same numbers). A validation that
    skipped every clip scores the starting weights on none either: no baseline yet, the next one tries
    again (a baseline of skipped_clips alone, kept, gave no `_vs_start` for good, resumes included)."""
    if not run.config.pretrained_model_path or "psnr" not in metrics:  # the same clips would skip for the start too
        return metrics
    if run.progress.baseline is None or "psnr" not in run.progress.baseline:  # or one an older run kept unscored
        start = TAEHV.from_pretrained(run.config.pretrained_model_path, variant=student_of(run.config).variant)
        baseline = validate(run, start.to(run.accelerator.device).eval())
        run.log.line(validation_line(0, baseline).replace("Validation at step 0", "Starting weights"))
        run.progress.baseline = baseline if "psnr" in baseline else None
        if run.progress.baseline is None:
            return metrics
    compared = {f"{k}_vs_start": metrics[k] - run.progress.baseline[k]
                for k in COMPARED_METRICS if k in metrics and k in run.progress.baseline}
    return {**metrics, **compared}


def validation_line(step: int, metrics: dict, seconds: float | None = None) -> str:
    """`Validation at step N | psnr: 24.10 dB | ssim: 0.81 | by frame: 25.0 23.9 ... dB | warping_error:
    0.0210 | colourfulness_ratio: 0.8100 | luma_psnr: 25.30 dB | chroma_psnr: 31.20 dB | 3.2 s`."""
    by_frame = [v for k, v in metrics.items() if k.startswith("psnr_frame")]

    def part(k: str, v: float) -> str:
        return (f"{k}: {v:.2f} dB" if k.endswith("psnr") else f"{k}: {v:+.2f} dB" if k.endswith("psnr_vs_start")
                else f"{k}: {v:+.4f}" if k.endswith("_vs_start") else f"{k}: {v}" if k == "skipped_clips" else f"{k}: {v:.4f}")

    late = [prefix + k for prefix in ("", "decode_") for k in COLOUR_AND_MOTION if prefix + k in metrics]
    late += [k for k in metrics if k[0].isdigit()]  # validation_sizes' metrics (64x64_psnr, ...) come last
    parts = [part(k, v) for k, v in metrics.items() if not k.startswith("psnr_frame") and k not in late]
    if by_frame:
        parts.append("by frame: " + " ".join(f"{v:.1f}" for v in by_frame) + " dB")
    parts += [part(k, metrics[k]) for k in late]
    if seconds is not None:
        parts.append(f"{seconds:.1f} s")
    return f"Validation at step {step} | " + " | ".join(parts)


def log_sample_image(run: TrainingRun, video: torch.Tensor, decoded: torch.Tensor, number: int) -> None:
    """Every frame of sample clip `number` as an animated GIF under val/sample_clip<number>:
    input | reconstruction | error x4, so motion and flicker show; and for the first clip its
    middle frame (input | reconstruction) under val/sample."""
    if not run.accelerator.is_main_process:
        return
    tracker = run.accelerator.get_tracker("tensorboard", unwrap=True)
    if number == 0:
        t = decoded.shape[1] // 2
        image = torch.cat([video[0, t], decoded[0, t]], dim=-1).clamp(0, 1).float().cpu()
        tracker.add_image("val/sample", image, global_step=run.progress.step)
    target = aligned(video, decoded)[0].float()
    strip = torch.cat([target, decoded[0].float(), ((decoded[0].float() - target).abs() * 4)], dim=-1)
    summary = animated_image_summary(f"val/sample_clip{number}", strip.clamp(0, 1).cpu())
    tracker.file_writer.add_summary(summary, run.progress.step)


def animated_image_summary(tag: str, frames: torch.Tensor, frame_ms: int = 125):
    """T,3,H,W in [0, 1] -> a TensorBoard image summary holding a looping GIF (what add_video
    writes, without its moviepy dependency); the images dashboard animates it."""
    import io

    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    pictures = [Image.fromarray((frame.permute(1, 2, 0) * 255).round().byte().numpy()) for frame in frames]
    buffer = io.BytesIO()
    pictures[0].save(buffer, format="GIF", save_all=True, append_images=pictures[1:], duration=frame_ms, loop=0)
    height, width = frames.shape[-2:]
    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=buffer.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def record_validation(run: TrainingRun, metrics: dict) -> bool:
    """validation_history.json, best_model/ and early stopping (a validation that scored no clip
    leaves both as they were). Returns True when the run should stop early. The record lives in
    Progress, so it resumes with the checkpoint."""
    config, progress, step = run.config, run.progress, run.progress.step
    if run.accelerator.is_main_process:
        try:  # rank 0 alone writes it, no other rank waits on it: a failed write is logged, not fatal
            run.seams.fire("file_write", "history", step)
            path = run.run_dir / "validation_history.json"
            history = json.loads(path.read_text()) if path.exists() else []
            history = [h for h in history if h["step"] < step]  # entries past a resumed checkpoint are replayed
            history.append({"step": step, **metrics})
            temporary = path.with_suffix(".json.tmp")
            temporary.write_text(json.dumps(history, indent=2) + "\n")
            temporary.replace(path)
        except OSError as failure:
            run.log.line(f"validation_history.json not updated at step {step}: {failure}; training continues")
    if "psnr" not in metrics:  # validate scored no clip: nothing to compare with the best
        return False
    value = metrics.get(config.best_metric)
    lower_is_better = config.best_metric.removeprefix("decode_") in LOWER_IS_BETTER
    # a NaN best (recorded before a validation that scored nothing gave no metric) is no best: never beaten
    no_best = progress.best_value is None or math.isnan(progress.best_value)
    improved = value is not None and (no_best or (value < progress.best_value if lower_is_better else value > progress.best_value))
    if improved:
        previous = progress.best_value, progress.best_step
        progress.best_value, progress.best_step, progress.validations_without_improvement = value, step, 0
        weights = {k: v.detach().float().cpu() for k, v in current_weights(run).items()}  # every rank: a collective
        try:
            if run.accelerator.is_main_process:
                run.seams.fire("file_write", "best_model", step)
            export_model(run.accelerator, weights, unwrap(run.accelerator, run.model).taehv, run.run_dir / "best_model",
                         step, metrics, best_metric=config.best_metric, **export_info(config))
            run.log.line(f"best model so far ({config.best_metric} {value:.4f}) saved to {run.run_dir / 'best_model'}")
        except OSError as failure:  # the previous best_model/ stays whole (written to a temporary folder first)
            progress.best_value, progress.best_step = previous  # the next validation that beats it saves it
            run.log.line(f"best model so far ({config.best_metric} {value:.4f}) NOT saved: {failure}; training continues")
        return False
    progress.validations_without_improvement += 1
    patience = config.early_stopping_patience
    if patience and progress.validations_without_improvement >= patience:
        run.log.line(f"early stopping: {config.best_metric} has not improved for {patience} validations "
                     f"(best {progress.best_value:.4f} at step {progress.best_step})")
        return True
    return False
