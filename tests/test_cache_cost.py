"""The dry run weighs a latent cache pass against the teacher on the fly over the planned steps
(training/plan/cache_cost.py): the teacher's FLOPs and floor per clip from the meta-device count,
times the clips drawn over max_steps, against epochs x training clips of a real clip folder or of
a cache's metadata. The expected numbers are computed here from the count and the floors."""

import argparse
import dataclasses
import json
import re

from training.config.load import load_config
from training.plan.roofline import H100, floor_s, shown
from training.plan.step_flops import step_costs


def teacher(config) -> tuple[float, float]:
    """(FLOPs, floor seconds on an H100) of one clip's reference encode."""
    reference = step_costs(config)["reference"]
    return reference["flops"] / 4, floor_s(reference["flops"], reference["bytes"], H100) / 4


def cost(clips: int, flops: float, floor: float) -> str:
    return f"{shown(clips * flops / 1e15)} PFLOP, {shown(clips * floor / 3600)} GPU-h at the floor"


def test_the_dry_run_weighs_a_cache_pass_of_the_clip_folder_against_the_teacher_over_max_steps(tmp_path, capsys):
    from training.data.synthetic_clips import make_sample_videos
    from training.loop.build import build_datasets
    from training.plan.cli import main

    make_sample_videos(tmp_path / "clips", count=7, n_frames=12)
    sets = [f"data_root={tmp_path / 'clips'}", "max_steps=30", "validation_fraction=0.2"]
    main(["h100", "--num-processes", "8", "--dry-run-report", *[a for s in sets for a in ("--set", s)]])
    printed = capsys.readouterr().out
    config = load_config("h100", sets, num_processes=8, check_paths=False)
    flops, floor = teacher(config)
    drawn = 30 * 4 * 8 * 4  # max_steps x (4 clips per GPU x 8 GPUs x 4 accumulation)
    clips = len(build_datasets(config)[0])  # what scripts/cache_latents.py --epochs 1 encodes
    assert 0 < clips < 7
    assert re.search(rf"\n  teacher: {flops / 1e12:.2f} TFLOP and [\d.]+ GB per clip \(floor {floor * 1e3:.1f} ms on H100 SXM\); "
                     rf"on the fly over max_steps=30 x 128 clips = {drawn:,} encodes: {re.escape(cost(drawn, flops, floor))}\n", printed)
    assert (f"a cache pass of 1 x {clips} clips ({tmp_path / 'clips'}, --epochs 1) = {clips} encodes: "
            f"{cost(clips, flops, floor)} ({clips / drawn:.3g}x on the fly); training reads each cached sample "
            f"(crop, frame offsets and flip fixed) {drawn / clips:,.1f} times\n") in printed


def test_a_named_cache_is_weighed_by_its_epochs_and_an_unlisted_data_root_by_the_break_even(tmp_path):
    from scripts.cache_latents import cache_metadata
    from training.plan.cache_cost import cache_cost_lines

    config = load_config("h100", ["max_steps=1000"], num_processes=8, check_paths=False)
    flops, floor = teacher(config)
    drawn = 1000 * 128
    options = argparse.Namespace(shard_size=256, epochs=3, dtype="bf16", store="logvar")
    (tmp_path / "cache.json").write_text(json.dumps(cache_metadata(config, options, {"train": 3 * 2000, "validation": 8})))
    lines = cache_cost_lines(dataclasses.replace(config, latent_cache=str(tmp_path)))
    assert lines[1] == (f"a cache pass of 3 x 2,000 clips (the cache {tmp_path}) = 6,000 encodes: {cost(6000, flops, floor)} "
                        f"({6000 / drawn:.3g}x on the fly); training reads each cached sample (crop, frame offsets and flip "
                        f"fixed) {drawn / 6000:,.1f} times")

    remote = cache_cost_lines(dataclasses.replace(config, data_root="s3://bucket/clips"))
    assert remote[0].endswith(f"= {drawn:,} encodes: {cost(drawn, flops, floor)}")
    assert remote[1].endswith(f"it costs less than on the fly while that is under {drawn:,}")
    assert cache_cost_lines(dataclasses.replace(config, use_ref_vae=False)) == []
