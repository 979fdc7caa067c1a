"""Object storage as a data source, against a real S3 server on loopback (SeaweedFS, started by the
tests; skipped, saying why, where `weed` is missing): a corpus prepared into a bucket, two
processes training from it across a 20 s outage of the store, an exact resume from it, and one
line for a missing bucket or refused credentials before anything starts."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared_in_store(s3_server, tmp_path_factory):
    """Synthetic H.264 sources prepared by the CLI straight into s3://clips/prepared."""
    from training.data.synthetic_clips import make_sample_videos

    sources = tmp_path_factory.mktemp("sources")
    make_sample_videos(sources, count=10, n_frames=48)
    s3_server.client().create_bucket(Bucket="clips")
    result = subprocess.run([sys.executable, "-m", "scripts.prepare_dataset", str(sources), "s3://clips/prepared",
                             "--segment-seconds", "1", "--workers", "2", "--cover", "32x32"],
                            cwd=REPO_ROOT, env=s3_server.env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return "s3://clips/prepared", result.stdout


def launch(s3_server, args, secret=None, **popen):
    env = {**s3_server.env(secret), "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    return subprocess.Popen([str(REPO_ROOT / "train_taehv_h100.sh"), *args], cwd=REPO_ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **popen)


def stop_store_after_checkpoint(s3_server, process, run_dir, step: int) -> None:
    """Kills the S3 server as soon as the run has written checkpoint-<step>: mid-run, with steps left to fetch."""
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / f"checkpoint-{step}").is_dir():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.05)
    s3_server.stop()


def test_prepare_writes_the_dataset_into_the_store(s3_server, prepared_in_store):
    url, stdout = prepared_in_store
    assert re.search(r"10 sources -> \d+ clips", stdout), stdout
    client = s3_server.client()
    summary = json.loads(client.get_object(Bucket="clips", Key="prepared/dataset.json")["Body"].read())
    index = [json.loads(line) for line in client.get_object(Bucket="clips", Key="prepared/index.jsonl")["Body"].read().splitlines()]
    assert summary["clips"] == len(index) >= 16 and summary["failed_sources"] == 0
    keys = {item["Key"] for item in client.list_objects_v2(Bucket="clips", Prefix="prepared/clips/")["Contents"]}
    assert {f"prepared/{clip['path']}" for clip in index} == keys  # every clip uploaded, no scratch file
    assert all(clip["frames"] >= 16 and clip["source"].endswith(".mp4") for clip in index)


def test_a_raw_bucket_is_listed_once_per_run(s3_server, tmp_path, monkeypatch):
    """Raw clips in a bucket (no prepared index): rank 0 lists the bucket into the run folder and
    every rank reads that listing."""
    from training.data.synthetic_clips import make_sample_videos

    client = s3_server.client()
    client.create_bucket(Bucket="raw")
    sources = tmp_path / "sources"
    make_sample_videos(sources, count=6, n_frames=24)
    for path in sources.glob("*.mp4"):
        client.upload_file(str(path), "raw", f"videos/{path.name}")
    run_dir = tmp_path / "run"
    process = launch(s3_server, ["2", "test", "--output-dir", str(run_dir), "--max-steps", "2",
                                 "--set", "data_root=s3://raw/videos", "--set", f"data_cache_dir={tmp_path / 'cache'}"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-4000:]
    listing = list(run_dir.glob("data_index-*.jsonl"))
    assert len(listing) == 1
    assert sorted(json.loads(line)["path"] for line in listing[0].read_text().splitlines()) == sorted(
        p.name for p in sources.glob("*.mp4"))
    cached = list((tmp_path / "cache").glob("??/*.mp4"))
    assert cached and sum(p.stat().st_size for p in cached) > 0  # the default cache keeps fetched clips

    # inference.py --held-out-of the run: its held-out clips come from the bucket as local copies
    import inference

    for key, value in s3_server.env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "inference_tmp"))
    held_out = inference.held_out_clips(run_dir)
    assert held_out and all(path.is_file() and path.suffix == ".mp4" for path in held_out)


def test_two_processes_train_from_the_store_across_an_outage_and_resume_exactly(s3_server, prepared_in_store, tmp_path):
    """data_cache_gb=0: every draw fetches its clip, so the outage is met for sure; the store comes
    back after 10 s and the run finishes. Then the second half is trained again from the
    checkpoint in the middle (a kill after it): the same final weights on both ranks."""
    url, _ = prepared_in_store
    run_dir = tmp_path / "run"
    args = ["2", "test", "--output-dir", str(run_dir), "--max-steps", "8", "--set", f"data_root={url}",
            "--set", "data_cache_gb=0", "--set", "checkpointing_steps=4", "--set", "validation_steps=8",
            "--set", f"data_cache_dir={tmp_path / 'cache'}"]
    process = launch(s3_server, args)
    try:
        stop_store_after_checkpoint(s3_server, process, run_dir, 4)
        time.sleep(10)  # retries back off 0.5, 1, 2, 4, 8 s: the one 15.5 s into the outage finds it back
        s3_server.start()
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output[-4000:]
    assert "did not answer" in output and "retrying for up to storage_retry_s=300" in output, output[-4000:]
    assert re.search(r"answered .* again after \d+ s", output), output[-4000:]
    first = dict(re.findall(r"rank (\d) of 2: final weights fingerprint ([0-9a-f]{16})", output))
    assert len(first) == 2 and len(set(first.values())) == 1, output[-3000:]
    listings = list(run_dir.glob("data_index-*.jsonl"))
    assert not listings, "a prepared dataset is read through its own index, not listed"

    for later in [p for p in (run_dir / "checkpoints").iterdir() if p.name != "checkpoint-4"]:
        shutil.rmtree(later)  # as if killed right after checkpoint-4
    shutil.rmtree(run_dir / "final")
    (run_dir / "FINISHED").unlink(missing_ok=True)
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    resumed = launch(s3_server, ["2", "test", "--output-dir", str(run_dir), "--resume", "latest"])
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output[-4000:]
    second = dict(re.findall(r"rank (\d) of 2: final weights fingerprint ([0-9a-f]{16})", output))
    assert second == first, output[-3000:]


def test_an_outage_longer_than_storage_retry_s_stops_every_rank_with_the_resume_command(s3_server, prepared_in_store, tmp_path):
    """At the defaults' ratio of storage_retry_s to step_timeout_s (1:2, the most the config allows):
    the storage stop, agreed by every rank, comes before the collective timeout would take the
    rank waiting on the store for a dead one."""
    url, _ = prepared_in_store
    run_dir = tmp_path / "run"
    process = launch(s3_server, ["2", "test", "--output-dir", str(run_dir), "--max-steps", "40", "--set", f"data_root={url}",
                                 "--set", "data_cache_gb=0", "--set", "storage_retry_s=5", "--set", "step_timeout_s=10",
                                 "--set", "validation_steps=40",
                                 "--set", f"data_cache_dir={tmp_path / 'cache'}"])
    try:
        stop_store_after_checkpoint(s3_server, process, run_dir, 2)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        s3_server.start()
    assert process.returncode == 3, output[-4000:]
    assert re.search(r"stopped on rank [01]: no data from object storage on ranks? [0-9, ]+: object store \S+ did not answer "
                     r"reading s3://clips/prepared/clips/\S+ for \d+ s \(storage_retry_s=5; EndpointConnectionError\); the last "
                     r"checkpoint is checkpoint-\d+: --resume latest continues once the store answers", output), output[-4000:]
    assert "continue with:" in output and "--resume latest" in output.split("continue with:")[-1], output[-2000:]
    assert "Traceback" not in output, output[-4000:]


@pytest.mark.parametrize("case", ["missing bucket", "bad credentials"])
def test_a_missing_bucket_or_refused_credentials_is_one_line_before_anything_starts(s3_server, tmp_path, case):
    url = "s3://no-such-bucket/videos" if case == "missing bucket" else "s3://clips/prepared"
    secret = "wrong-secret" if case == "bad credentials" else None
    expected = "bucket 'no-such-bucket' does not exist" if case == "missing bucket" else "refused the credentials"
    dry = launch(s3_server, ["1", "test", "--dry-run", "--set", f"data_root={url}"], secret)
    output, _ = dry.communicate(timeout=120)
    assert dry.returncode != 0 and expected in output, output[-3000:]
    run_dir = tmp_path / "run"
    real = launch(s3_server, ["1", "test", "--output-dir", str(run_dir), "--set", f"data_root={url}"], secret)
    output, _ = real.communicate(timeout=120)
    assert real.returncode == 2, output[-3000:]
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0] and url in lines[0], output
    assert not run_dir.exists()


def test_an_endpoint_nobody_answers_on_is_one_line_naming_it(tmp_path):
    """No server needed: a port nothing listens on."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret",
           "AWS_DEFAULT_REGION": "us-east-1"}
    result = subprocess.run([sys.executable, "-m", "training.plan", "test", "--set", "data_root=s3://clips/videos"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config error: data_root='s3://clips/videos': cannot reach the object "
                                                   f"store at {endpoint}") and lines[0].endswith("check AWS_ENDPOINT_URL"), lines
