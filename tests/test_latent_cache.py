"""The latent cache: written by real processes with a real (tiny) diffusers VAE, read back to the
same clips and latents, continued after a partial write, and training from it logs the losses of
training on the fly."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, free_port

from models.reference_vae import load_reference_vae, tiny_reference_vae_config, vae_class
from training.config.load import load_config
from training.config.schema import ConfigError
from training.data.latent_cache import CachedClipDataset, shard_path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from training.data.synthetic_clips import make_sample_videos

    root = tmp_path_factory.mktemp("cache_setup")
    torch.manual_seed(0)
    vae_class("cogvideox")(**tiny_reference_vae_config("cogvideox")).save_pretrained(str(root / "vae" / "vae"))
    make_sample_videos(root / "clips", count=6, n_frames=24)
    sets = [f"data_root={root / 'clips'}", "use_ref_vae=true", f"ref_vae_path={root / 'vae'}", "n_frames=9",
            "encoder_weight=0.1", "decoder_weight=0.1", "ref_vae_sample_latents=false", "horizontal_flip=true"]
    return root, sets


def cache_command(out, sets, *options, processes=1):
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO_ROOT / "accelerate_configs" / "ddp_cpu.yaml"), "--num_processes", str(processes),
                "--main_process_port", str(free_port()), "-m"] if processes > 1 else [sys.executable, "-m"]
    command = launcher + ["scripts.cache_latents", "test", "--out", str(out), *options]
    for item in sets:
        command += ["--set", item]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


@pytest.mark.slow
def test_two_processes_write_the_clips_and_latents_training_would_draw(setup, tmp_path):
    root, sets = setup
    result = cache_command(tmp_path / "cache", sets, "--shard-size", "2", "--epochs", "2", "--dtype", "fp32", processes=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0:" in result.stdout and "rank 1:" in result.stdout  # both processes wrote shards
    meta = json.loads((tmp_path / "cache" / "cache.json").read_text())
    assert meta["complete"] and meta["splits"]["train"] == {"samples": 10, "shards": 5}
    samples = sum(split["samples"] for split in meta["splits"].values())  # both ranks' clips, gathered
    assert (meta["encode_pass"]["processes"], meta["encode_pass"]["clips"]) == (2, samples)

    from training.loop.build import build_datasets

    config = load_config("test", sets, num_processes=1)
    on_the_fly, _ = build_datasets(config)
    reference = load_reference_vae("cogvideox", str(root / "vae"), torch.device("cpu"), sample_latents=False)
    cached = CachedClipDataset(tmp_path / "cache", "train", root / "clips", sample_latents=False, seed=config.seed)
    flips = set()
    for sample in range(10):  # sample k of the cache is draw (epoch k // clips, clip k % clips)
        expected = on_the_fly[divmod(sample, len(on_the_fly))]
        item = cached[(3, sample)]  # the reading epoch only seeds latent noise
        assert torch.equal(item["video"], expected["video"])
        latents = reference.encode(expected["video"][None].float() / 255)[0]
        torch.testing.assert_close(item["latents"], latents, rtol=0, atol=1e-5)
        flips.add(expected["recipe"]["flip"])
    assert flips == {True, False}  # flipped clips were among them

    sampling = CachedClipDataset(tmp_path / "cache", "train", root / "clips", sample_latents=True, seed=config.seed)
    first, again, next_epoch = sampling[(0, 1)]["latents"], sampling[(0, 1)]["latents"], sampling[(1, 1)]["latents"]
    assert torch.equal(first, again) and not torch.equal(first, next_epoch)  # a fresh sample per epoch, reproducible
    assert not torch.allclose(first, cached[(0, 1)]["latents"])


@pytest.mark.slow
def test_a_shard_one_rank_cannot_write_stops_both_ranks_and_keeps_the_others_shards(setup, tmp_path):
    """Rank 1's first shard cannot be written (a folder holds its path, as a full or read-only disk
    would refuse it): rank 1 stops encoding, rank 0 finishes its own shards, and both exit with one
    error naming rank 1. Before, rank 1 returned at once: torchrun then ended rank 0 mid-shard (and
    a rank on another node would have waited in the closing gather until the collective timeout)."""
    root, sets = setup
    out = tmp_path / "cache"
    blocked = shard_path(out, "train", 1)  # shards go round robin: shard 1 is rank 1's first
    blocked.mkdir(parents=True)
    (blocked / "something").write_text("in the way")
    result = cache_command(out, sets, "--shard-size", "2", "--dtype", "fp32", processes=2)
    assert result.returncode != 0 and "error on rank 1: " in result.stderr, result.stderr[-3000:]
    assert "error: rank 1 stopped on an error (above); the shards written are kept" in result.stderr
    assert shard_path(out, "train", 0).is_file() and shard_path(out, "train", 2).is_file()  # rank 0's work kept
    assert not json.loads((out / "cache.json").read_text()).get("complete")


@pytest.mark.slow
def test_a_partial_cache_is_refused_then_continued_with_the_missing_shards_only(setup, tmp_path):
    root, sets = setup
    out = tmp_path / "cache"
    assert cache_command(out, sets, "--shard-size", "2").returncode == 0
    shards = sorted(out.rglob("shard-*.pt"))
    assert torch.load(shards[0], weights_only=True)["mean"].dtype == torch.bfloat16  # the default storage
    before = {p: (p.stat().st_mtime_ns, torch.load(p, weights_only=True)["mean"]) for p in shards}
    # as a killed writer leaves it: one shard missing, its temporary file half there, not complete
    missing = shard_path(out, "train", 1)
    missing.unlink()
    missing.with_name(missing.name + ".tmp").write_bytes(b"half a shard")
    meta = json.loads((out / "cache.json").read_text())
    (out / "cache.json").write_text(json.dumps({**meta, "complete": False}))

    with pytest.raises(ConfigError, match="is incomplete: re-run the same scripts.cache_latents command"):
        load_config("test", [*sets, f"latent_cache={out}"], num_processes=1)
    other = cache_command(out, [*sets, "height=40"], "--shard-size", "2")
    assert other.returncode == 2 and "written with height=32, this config has 40" in other.stderr

    result = cache_command(out, sets, "--shard-size", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 shards written" in result.stdout
    for path, (mtime, mean) in before.items():
        assert torch.equal(torch.load(path, weights_only=True)["mean"], mean)
        assert (path.stat().st_mtime_ns == mtime) == (path != missing)
    assert json.loads((out / "cache.json").read_text())["complete"]
    with pytest.raises(ConfigError, match=r"written with n_frames=9 but this run has n_frames=17"):
        load_config("test", [*sets, "n_frames=17", f"latent_cache={out}"], num_processes=1)
    assert json.loads((out / "cache.json").read_text())["settings"]["ref_vae_latent_space"] == "raw"  # cogvideox's
    with pytest.raises(ConfigError, match=r"holds raw latents but this run learns ref_vae_latent_space=scaled \(scaled\): "
                                          r"re-write the cache for this config, or set ref_vae_latent_space=raw"):
        load_config("test", [*sets, "ref_vae_latent_space=scaled", f"latent_cache={out}"], num_processes=1)

    means_only = tmp_path / "means_only"
    assert cache_command(means_only, sets, "--store", "mean", "--shard-size", "8").returncode == 0
    with pytest.raises(ConfigError, match="holds means only, but ref_vae_sample_latents=true"):
        load_config("test", [*sets, "ref_vae_sample_latents=true", f"latent_cache={means_only}"], num_processes=1)


@pytest.mark.slow
def test_training_from_the_cache_logs_the_losses_of_training_on_the_fly(setup, tmp_path):
    root, sets = setup
    sets = [*sets, "seraena_weight=0.1"]  # 9 frames: 3 frame groups per clip, enough for BatchNorm
    assert cache_command(tmp_path / "cache", sets, "--shard-size", "2", "--dtype", "fp32").returncode == 0

    def train(run_dir, extra):
        env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
        args = [str(REPO_ROOT / "train_taehv_h100.sh"), "1", "test", "--output-dir", str(run_dir)]
        for item in [*sets, *extra]:
            args += ["--set", item]
        result = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert result.returncode == 0, result.stderr[-3000:]
        return re.findall(r"Step \d+/\d+ \| Loss: ([\d.]+)|Validation at step \d+ \| (.*) \| [\d.]+ s$",  # its time differs
                          (run_dir / "train.log").read_text(), re.M)

    # one epoch of 5 clips covers the 4 steps, so both runs see draw (0, i) for the same i
    on_the_fly = train(tmp_path / "fly", [])
    from_cache = train(tmp_path / "cached", [f"latent_cache={tmp_path / 'cache'}"])
    assert len(on_the_fly) == 6 and from_cache == on_the_fly
    assert "latents from the cache" in (tmp_path / "cached" / "train.log").read_text()


@pytest.mark.slow
def test_batched_encodes_write_the_latents_of_one_by_one_and_report_clips_per_s(setup, tmp_path):
    """The test profile trains 1 clip per GPU, so the other tests encode one clip per call; here the
    script stacks 3 (batches of 3 and 2 over the 5 training clips) and the one-by-one encode of the
    same draws, in-process, must write the same samples."""
    from scripts.cache_latents import encode_shard, split_keys
    from training.loop.build import build_datasets

    root, sets = setup
    out = tmp_path / "cache"
    result = cache_command(out, sets, "--batch-size", "3", "--shard-size", "8", "--dtype", "fp32")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: cogvideox reference VAE in float32 on cpu, 3 clips per encode" in result.stdout
    meta = json.loads((out / "cache.json").read_text())
    record, samples = meta["encode_pass"], sum(split["samples"] for split in meta["splits"].values())
    assert (record["clips"], record["processes"], record["batch_size"], record["dtype"]) == (samples, 1, 3, "float32")
    assert record["clips_per_s"] == pytest.approx(samples / record["seconds"])
    rate = re.search(rf"rank 0: 2 shards written, 0 already there; {samples} clips encoded in ([\d.]+) s: ([\d.]+) clips/s "
                     r"\(([\d.]+) clips/s in the reference VAE's encode alone\)", result.stdout)
    # both printed to 2 decimals: the seconds' rounding (up to 0.005 s) bounds the rate's
    seconds = float(rate[1]) if rate else 0.0
    assert rate and samples / (seconds + 0.005) - 0.005 <= float(rate[2]) <= samples / max(seconds - 0.005, 1e-9) + 0.005
    assert float(rate[3]) >= float(rate[2])  # the encode alone leaves out decoding and writing
    assert f"this pass: {samples} clips in" in result.stdout

    config = load_config("test", sets, num_processes=1)
    train, _ = build_datasets(config)
    reference = load_reference_vae("cogvideox", str(root / "vae"), torch.device("cpu"), sample_latents=False)
    one_by_one, _ = encode_shard(train, split_keys("train", train, 1, 0), reference, 1, 0, torch.float32, True)
    batched = torch.load(shard_path(out, "train", 0), weights_only=True)
    assert len(batched["clip"]) == len(train) == 5
    for key in ("sources", "crop", "flip", "clip", "skipped"):
        assert batched[key] == one_by_one[key] if isinstance(one_by_one[key], list) else torch.equal(batched[key], one_by_one[key])
    for key in ("mean", "logvar"):
        torch.testing.assert_close(batched[key], one_by_one[key], rtol=0, atol=1e-5)


def test_a_shard_that_cannot_be_written_is_a_one_line_error_and_leaves_no_temporary_file(tmp_path):
    from training.base.latent_format import CacheError
    from training.data.latent_cache import write_shard

    (tmp_path / "train").write_text("a file where the split folder should be")
    with pytest.raises(CacheError, match=r"cannot write .*shard-000000.pt .*re-run the same command"):
        write_shard(shard_path(tmp_path, "train", 0), {"mean": torch.zeros(1)})
    folder = tmp_path / "ok"
    write_shard(shard_path(folder, "train", 0), {"mean": torch.zeros(1)})
    assert [p.name for p in (folder / "train").iterdir()] == ["shard-000000.pt"]
