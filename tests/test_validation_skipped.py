"""A validation that skips every held-out clip (non-finite reference latents: a bf16 overflow, or
NaN latents in a latent cache) reports no metric: best_model/ and early stopping stay as they
were, one line names the clips, and the next real validation is compared with the last real best.
The comparison with the starting weights (`<metric>_vs_start`) starts at the first validation that
scores. Two gloo ranks, each scoring one clip, call validation's functions as the training loop does."""

import hashlib
import json
import math
import os
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
from conftest import free_port

SKIPPED = {1, 3}  # the validations whose clips all carry NaN latents


def best_model_files(folder: Path) -> dict | None:
    """best_model/'s files: content hash and modification time, and the step model_info.json records."""
    best = folder / "best_model"
    if not best.is_dir():
        return None
    files = {p.name: [hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns] for p in sorted(best.iterdir())}
    return {**files, "step": json.loads((best / "model_info.json").read_text())["step"]}


def validate_on_two_ranks(rank: int, port: int, folder: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    from models.taehv import TAEHV
    from training.base.run_log import RunLog
    from training.base.seams import Seams
    from training.config.load import load_config
    from training.loop import validation

    validation.log_sample_image = lambda *args: None  # this run has no TensorBoard tracker
    folder = Path(folder)
    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=60))])
    config = load_config("test", ["use_ref_vae=true", f"latent_cache={folder / 'cache'}", "n_frames=9", "model_variant=taecvx",
                                  "validation_samples=2", "validation_batch_size=1",
                                  f"pretrained_model_path={folder / 'start' / 'taecvx.pth'}"], 2, check_paths=False)
    torch.manual_seed(0)
    model = TAEHV("taecvx").eval()
    if accelerator.is_main_process:  # the starting weights: the model validated at steps 1-4
        (folder / "start").mkdir()
        torch.save(model.state_dict(), folder / "start" / "taecvx.pth")
    accelerator.wait_for_everyone()
    videos = [(torch.rand(9, 3, 32, 32) * 255).to(torch.uint8) for _ in range(2)]
    with torch.no_grad():  # the cache's latents as scripts/cache_latents.py stores them (bf16); NaN for a broken cache
        cached = [model.encode_video(video[None].float() / 255)[0].bfloat16() for video in videos]
    finite = [{"video": v, "latents": l, "recipe": {"clip": f"held_out_{i}.mp4"}} for i, (v, l) in enumerate(zip(videos, cached))]
    broken = [{**clip, "latents": torch.full_like(clip["latents"], float("nan"))} for clip in finite]

    class GivesTheClipBack(torch.nn.Module):  # a better round trip than the model's: a new best
        def forward(self, video):
            return video

        def decode_video(self, latents):
            return model.decode_video(latents)

    run = SimpleNamespace(config=config, accelerator=accelerator, lpips=None, reference_vae=None, seams=Seams(),
                          log=RunLog(folder, enabled=accelerator.is_main_process), run_dir=folder,
                          model=SimpleNamespace(taehv=model), ema=SimpleNamespace(shadow=model.state_dict()),
                          progress=SimpleNamespace(step=0, best_value=None, best_step=None, validations_without_improvement=0,
                                                   baseline=None))
    report = []
    for step in range(1, 6):  # what training/loop/train.py does at each validation
        run.progress.step = step
        run.validation_dataset = broken if step in SKIPPED else finite
        if step == 4:  # as a checkpoint of a run before the fix kept it: the baseline of a validation that scored none
            run.progress.baseline = {"skipped_clips": 2}
        metrics = validation.with_baseline(run, validation.validate(run, GivesTheClipBack() if step == 5 else model))
        run.log.line(validation.validation_line(step, metrics))
        stop = validation.record_validation(run, metrics)
        progress = run.progress
        # rank 0 writes best_model/: only it reads the folder (rank 1 could read it mid-write)
        files = best_model_files(folder) if accelerator.is_main_process else None
        report.append({"step": step, "metrics": metrics, "stop": stop, "best_model": files,
                       "record": [progress.best_value, progress.best_step, progress.validations_without_improvement]})
    (folder / f"report{rank}.json").write_text(json.dumps(report))
    # both ranks done before either tears its process group down: a rank that exits with gloo's threads
    # still running aborts ("terminate called without an active exception")
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def test_a_validation_that_skips_every_clip_reports_no_metric_and_keeps_the_best(tmp_path):
    torch.multiprocessing.spawn(validate_on_two_ranks, args=(free_port(), str(tmp_path)), nprocs=2)
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    assert [entry["record"] for entry in reports[0]] == [entry["record"] for entry in reports[1]]  # both ranks decide alike
    first, skipped, again, equal, better = reports[0]
    for entry in reports[0]:
        assert all(math.isfinite(v) for v in entry["metrics"].values()), entry  # no NaN to TensorBoard or the history
        assert not entry["stop"]
    for entry in (first, again):  # no metric at all, only the count
        assert entry["metrics"] == {"skipped_clips": 2}
    # the starting weights are scored at the first validation that scores (step 2), again after a resume whose
    # checkpoint kept an unscored baseline (step 4); the model of steps 2 and 4 is the starting one
    for entry in (skipped, equal):
        assert entry["metrics"]["psnr_vs_start"] == 0.0 and entry["metrics"]["ssim_vs_start"] == 0.0, entry
    assert first["best_model"] is None and first["record"] == [None, None, 0]  # no NaN became the first best
    best_psnr = skipped["metrics"]["psnr"]
    assert skipped["record"] == [best_psnr, 2, 0] and skipped["best_model"]["step"] == 2
    assert again["best_model"] == skipped["best_model"] and again["record"] == skipped["record"]  # untouched
    # the next real validation is compared with the last real best: equal is no improvement, better saves
    assert equal["metrics"]["psnr"] == best_psnr and equal["record"] == [best_psnr, 2, 1]
    assert equal["best_model"] == skipped["best_model"]
    assert better["metrics"]["psnr"] > best_psnr and better["record"] == [better["metrics"]["psnr"], 5, 0]
    assert better["best_model"]["step"] == 5
    assert better["metrics"]["psnr_vs_start"] == better["metrics"]["psnr"] - best_psnr > 0
    log = (tmp_path / "train.log").read_text()
    assert not re.search(r"\bnan\b", log, re.IGNORECASE), log
    named = [line for line in log.splitlines() if "held_out_0.mp4" in line or "held_out_1.mp4" in line]
    assert len(named) == 2, log  # one line at each validation that scored no clip, naming both clips and their ranks
    assert all("held_out_0.mp4 (rank 0)" in line and "held_out_1.mp4 (rank 1)" in line and "no metric" in line for line in named)
    history = json.loads((tmp_path / "validation_history.json").read_text())
    assert [entry["step"] for entry in history] == [1, 2, 3, 4, 5]
    assert history[0] == {"step": 1, "skipped_clips": 2} and history[2] == {"step": 3, "skipped_clips": 2}
