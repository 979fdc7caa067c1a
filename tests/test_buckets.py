"""Aspect and size buckets (docs/data.md#aspect-buckets): each clip in the bucket nearest its aspect
ratio, each micro-step one bucket on every rank, disjoint and exactly resumable sampling, memory
planned for the largest bucket, the dry run's listing, and a 2-process run that resumes exactly.
A run without buckets keeps the sampler and draws it had."""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, free_port

from training.config.load import load_config
from training.config.schema import ConfigError
from training.config.views import at_largest_bucket
from training.data.buckets import BucketBatchSampler, assign_buckets
from training.data.clips import ClipSpec, DataFailureError, EpochShardSampler, VideoClipDataset
from training.data.index import ClipIndex, read_index

BUCKETS = ((24, 40), (40, 24), (32, 32))  # landscape, portrait, square at about 1,000 pixels
SETS = ["buckets=24,40,40,24,32,32"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    """Synthetic clips of 5 sizes: landscape 4:3, 16:9 and 10:7, portrait 3:4 and square, with index.jsonl."""
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("clips")
    make_sample_videos(folder, count=24, n_frames=24)
    return folder


def test_each_clip_goes_to_the_bucket_nearest_its_displayed_aspect():
    #        16:9 4:3  3:4  square  3:4 stored as 4:3 turned  9:16 turned to 16:9  no size  1:1.1
    width = [1920, 640, 480, 500, 640, 1080, -1, 100]
    height = [1080, 480, 640, 500, 480, 1920, -1, 110]
    rotation = [0, 0, 0, 0, 90, -90, 0, 0]
    index = ClipIndex("/clips", [f"{i}.mp4" for i in range(8)], width=width, height=height, rotation=rotation)
    assert assign_buckets(index, BUCKETS, (32, 32)).tolist() == [0, 0, 1, 2, 1, 0, 2, 2]
    # a clip without a size goes where a run without buckets puts it: the bucket nearest height x width
    assert assign_buckets(index, BUCKETS, (24, 48))[6] == 0
    # on a log scale 2:1 and 1:2 are equally far from 1:1; a tie goes to the bucket listed first
    assert assign_buckets(ClipIndex("/c", ["a.mp4"], width=[64], height=[64]), ((32, 64), (64, 32)), (32, 32)).tolist() == [0]


@pytest.mark.parametrize("world_size, batch_size", [(1, 1), (3, 2), (2, 4)])
def test_bucket_sampler_is_disjoint_one_bucket_per_micro_step_and_resumes_exactly(world_size, batch_size):
    ids = np.array([0] * 50 + [1] * 31 + [2] * 22)
    np.random.default_rng(0).shuffle(ids)
    ranks = [BucketBatchSampler(ids, batch_size, rank, world_size, seed=1, shapes=BUCKETS) for rank in range(world_size)]
    group = batch_size * world_size
    assert ranks[0].batches_per_epoch == 50 // group + 31 // group + 22 // group
    drawn = [list(sampler) for sampler in ranks]
    assert all(len(d) == ranks[0].batches_per_epoch * batch_size for d in drawn)
    everything = [index for d in drawn for _, index in d]
    assert len(everything) == len(set(everything))  # disjoint across ranks and batches
    seen_buckets = set()
    for step in range(ranks[0].batches_per_epoch):  # micro-step k: one bucket on every rank
        batch = [index for d in drawn for _, index in d[step * batch_size : (step + 1) * batch_size]]
        assert len({ids[i] for i in batch}) == 1
        seen_buckets.add(ids[batch[0]])
    assert seen_buckets == {0, 1, 2}  # buckets interleave, not one after another by chance alone
    for position in (1, ranks[0].batches_per_epoch // 2):
        resumed = BucketBatchSampler(ids, batch_size, world_size - 1, world_size, seed=1, shapes=BUCKETS)
        resumed.set_position(0, position)
        assert list(resumed) == drawn[-1][position * batch_size :] and len(resumed) == len(drawn[-1]) - position * batch_size
    later = BucketBatchSampler(ids, batch_size, 0, world_size, seed=1, shapes=BUCKETS)
    later.set_position(1)
    assert [i for _, i in later] != [i for _, i in drawn[0]]  # each epoch its own permutation


def test_a_bucket_sampler_without_one_full_micro_step_is_one_line():
    with pytest.raises(DataFailureError, match=r"^no bucket holds the 8 training clips one micro-step takes "
                                               r"\(batch_size_per_gpu 4 x 2 processes; clips per bucket: 24x40 7, 40x24 3, "
                                               r"32x32 0\): add clips"):
        BucketBatchSampler([0] * 7 + [1] * 3, 4, 0, 2, shapes=BUCKETS)


def test_a_run_without_buckets_keeps_its_sampler_and_its_draws(clips):
    from training.loop.build import build_datasets, build_train_loader

    config = load_config("test", [f"data_root={clips}", f"index_path={clips}/index.jsonl"], 2, check_paths=False)
    assert config.buckets == ()
    train, _ = build_datasets(config)
    assert train.bucket_ids is None
    _, sampler = build_train_loader(config, train, 1, 2)
    assert type(sampler) is EpochShardSampler
    golden = EpochShardSampler(20, 2, 1, 2, seed=5)  # its draws as before buckets existed
    golden.set_position(1, 1)
    assert list(golden) == [(1, 4), (1, 3), (1, 5), (1, 10), (1, 19), (1, 7), (1, 1), (1, 0)]


def test_every_batch_is_one_bucket_cut_as_without_buckets_and_validation_stays_at_height_x_width(clips):
    from training.loop.build import build_datasets, build_train_loader

    config = load_config("test", [f"data_root={clips}", f"index_path={clips}/index.jsonl", "batch_size_per_gpu=2", *SETS],
                         2, check_paths=False)
    assert config.buckets == BUCKETS
    train, validation = build_datasets(config)
    loaders = [build_train_loader(config, train, rank, 2)[0] for rank in (0, 1)]
    shapes = []
    for first, second in zip(*loaders):  # one epoch, micro-step by micro-step
        assert first["video"].shape == second["video"].shape
        shapes.append(tuple(first["video"].shape[-2:]))
    assert len(set(shapes)) >= 2 and set(shapes) <= set(BUCKETS)
    # a clip is cut to its bucket exactly as a run without buckets at that height x width cuts it
    index = next(i for i, bucket in enumerate(train.bucket_ids) if bucket == 1)  # a portrait clip
    alone = VideoClipDataset(train.index, dataclasses.replace(train.spec, height=40, width=24, buckets=()), seed=config.seed)
    assert torch.equal(train[(3, index)]["video"], alone[(3, index)]["video"])
    assert validation[0]["video"].shape[-2:] == (32, 32)


def test_buckets_need_clip_sizes_a_folder_listing_lacks(clips, tmp_path):
    listing = tmp_path / "listing.jsonl"  # paths only, as a run's listing of data_root is
    listing.write_text("".join(f'{{"path": "{p.name}"}}\n' for p in sorted(clips.glob("*.mp4"))))
    with pytest.raises(DataFailureError) as error:
        VideoClipDataset(read_index(listing, clips), ClipSpec(8, 32, 32, buckets=BUCKETS))
    assert str(error.value) == (f"buckets 24x40, 40x24, 32x32 need each clip's width and height, and the index of {clips} has "
                                f"none (a folder listing): set index_path={clips}/index.jsonl (the folder's own index, with "
                                "the sizes)")


@pytest.mark.parametrize("sets, message", [
    (["buckets=24,40,40"], "buckets=24,40,40: --set lists height,width pairs, e.g. buckets=256,448,448,256,320,320; "
                           "this has an odd count"),
    (["buckets=24,40,36,24"], "buckets: 36x24 must have both sides positive multiples of 8 for taehv: use 32x24"),
    (["buckets=24,40,32,32,24,40"], "buckets lists 24x40 more than once: remove the repeat"),
    (["buckets=24,40", "latent_cache=/cache"], "buckets with latent_cache='/cache': a cache stores one crop per clip"),
])
def test_bad_buckets_fail_in_one_line_naming_the_fix(sets, message):
    with pytest.raises(ConfigError) as error:
        load_config("test", sets, check_paths=False)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_buckets_from_a_file_and_from_set_are_the_same_pairs(tmp_path):
    custom = tmp_path / "custom.py"
    custom.write_text('base_profile = "test"\noverrides = dict(buckets=((24, 40), [40, 24], (32, 32)))\n')
    assert load_config(str(custom), check_paths=False).buckets == load_config("test", SETS, check_paths=False).buckets == BUCKETS


def test_memory_is_planned_for_the_largest_bucket():
    from training.plan.memory import estimate_memory

    bucketed = load_config("test", ["buckets=24,40,40,24,48,48,32,32", "seraena_weight=0.1", "batch_size_per_gpu=2"], 1, check_paths=False)
    assert (at_largest_bucket(bucketed).height, at_largest_bucket(bucketed).width) == (48, 48)
    largest = load_config("test", ["height=48", "width=48", "seraena_weight=0.1", "batch_size_per_gpu=2"], 1, check_paths=False)
    smaller = load_config("test", ["seraena_weight=0.1", "batch_size_per_gpu=2"], 1, check_paths=False)  # height x width 32x32
    assert estimate_memory(bucketed) == estimate_memory(largest) != estimate_memory(smaller)


def test_the_dry_run_lists_the_buckets_with_their_share_of_clips(clips, capsys, tmp_path):
    from training.plan.cli import main

    train, _ = read_index(clips / "index.jsonl").split(0.15)
    landscape = int(sum(w > h for w, h in zip(train.width, train.height)))
    assert main(["test", "--set", f"data_root={clips}", "--set", f"index_path={clips}/index.jsonl", *["--set", SETS[0]],
                 "--num-processes", "2", "--output-dir", str(tmp_path / "run"), "--dry-run-report"]) == 0
    out = capsys.readouterr().out
    assert (f"  24x40 (960 px, aspect 1.67): {landscape} of {len(train)} training clips ({landscape / len(train):.0%}), "
            f"{landscape // 2} micro-steps per epoch\n") in out
    assert "  32x32 (1,024 px, aspect 1.00): " in out and "; the memory estimate's shape\n" in out
    assert "  validation clips: at height x width (32x32), as without buckets\n" in out
    # without a readable index: the buckets alone, and why
    assert main(["test", "--set", f"data_root={clips}", "--set", SETS[0], "--output-dir", str(tmp_path / "run"),
                 "--dry-run-report"]) == 0
    out = capsys.readouterr().out
    assert "  24x40 (960 px, aspect 1.67)\n" in out
    assert f"  shares of clips not known here: data_root={clips} is listed without clip sizes: set index_path=" in out


def test_the_replay_buffer_replays_fakes_of_the_shape_it_is_given():
    import random

    from models.seraena import ReplayBuffer

    def filled(shapes):
        buffer, generator = ReplayBuffer(8, random.Random(0)), torch.Generator().manual_seed(0)
        for shape in shapes:
            buffer.add(torch.rand(2, 9, *shape, generator=generator), torch.rand(2, 4, shape[0] // 8, shape[1] // 8, generator=generator))
        return buffer

    mixed = filled([(24, 40), (40, 24), (24, 40)])
    fakes, contexts = mixed.sample(5, torch.Size((9, 40, 24)))
    assert fakes.shape == (5, 9, 40, 24) and contexts.shape == (5, 4, 5, 3)
    assert mixed.sample(3, torch.Size((9, 32, 32))) is None  # no fake of that shape yet: the newest ones only
    one, same = filled([(32, 32)] * 3), filled([(32, 32)] * 3)  # one shape: the draws of a run without buckets
    assert torch.equal(one.sample(4)[0], same.sample(4, torch.Size((9, 32, 32)))[0])


def launch(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    return subprocess.run([str(REPO_ROOT / "train_taehv_h100.sh"), "2", "test", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=400)


def final_fingerprints(result: subprocess.CompletedProcess) -> dict:
    return dict(re.findall(r"rank (\d) of 2: final weights fingerprint ([0-9a-f]{16})", result.stdout + result.stderr))


def seraena_fingerprints(result: subprocess.CompletedProcess) -> dict:
    return dict(re.findall(r"rank (\d) of 2: seraena fingerprint ([0-9a-f]{16})", result.stdout + result.stderr))


@pytest.mark.slow
def test_a_bucketed_run_with_seraena_trains_on_two_processes_and_resumes_exactly(clips, tmp_path):
    """2 processes, 3 buckets, Seraena on (its replay buffer then holds fakes of 3 shapes), 2 clips per
    rank (3 micro-steps an epoch): 6 steps with checkpoints every 2; then the last 2 steps again from
    checkpoint-4, in the middle of the second epoch (as after a kill right after it): the same final
    weights on both ranks."""
    run_dir = tmp_path / "run"
    args = ["--output-dir", str(run_dir), "--max-steps", "6", "--set", f"data_root={clips}",
            "--set", f"index_path={clips}/index.jsonl", "--set", SETS[0], "--set", "batch_size_per_gpu=2",
            "--set", "seraena_weight=0.1", "--set", "checkpointing_steps=2", "--set", "validation_steps=6"]
    first = launch(args)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    uninterrupted = final_fingerprints(first)
    assert len(uninterrupted) == 2 and len(set(uninterrupted.values())) == 1, first.stdout[-3000:]

    shutil.rmtree(run_dir / "checkpoints" / "checkpoint-6")
    shutil.rmtree(run_dir / "final")
    (run_dir / "FINISHED").unlink(missing_ok=True)
    resumed = launch(["--output-dir", str(run_dir), "--resume", "latest"])
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    assert f"resumed from {run_dir}/checkpoints/checkpoint-4 at step 4" in resumed.stdout
    assert "resume changes" not in resumed.stdout  # the recorded buckets read back as the same pairs
    assert final_fingerprints(resumed) == uninterrupted, resumed.stdout[-3000:]
    assert seraena_fingerprints(resumed) == seraena_fingerprints(first)  # the discriminator too
