"""torch.compile where it pays (docs/performance.md#compile): the reference VAE's encode compiled as
a setting of its own, the compile time in train.log, the compiled artefacts in a folder that
outlives a container's /tmp, and a real run through the training entry with fault injection's
hooks. The aot_eager backend runs AOT autograd as inductor does, without a C++ compiler."""

import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, free_port

from models.measure_cache import compile_cache_dir
from models.reference_vae import ReferenceVAE, tiny_reference_vae
from training.config.load import load_config
from training.config.schema import ConfigError


def test_compiled_artefacts_outlive_tmp_unless_the_user_chose_a_folder(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compile_cache_dir() == os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "xdg" / "taehv" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what importing diffusers writes there
    assert compile_cache_dir() == str(tmp_path / "xdg" / "taehv" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_the_dry_run_names_the_compile_cache(monkeypatch, tmp_path, capsys):
    from training.plan.cli import main

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    main(["test", "--dry-run-report", "--set", "compile=true", "--set", "compile_backend=aot_eager"])
    assert (f"compile (the student, backend aot_eager; docs/performance.md#compile):\n  the first micro-step compiles "
            f"(train.log says how long); artefacts cached in {tmp_path / 'mine'}\n") in capsys.readouterr().out


def test_ref_vae_compile_is_refused_where_no_reference_encodes():
    with pytest.raises(ConfigError, match=r"ref_vae_compile=true with use_ref_vae=false: no reference VAE encodes in this "
                                          r"run; set ref_vae_compile=false"):
        load_config("test", ["ref_vae_compile=true"], check_paths=False)  # the test profile is an autoencoder
    with pytest.raises(ConfigError, match=r"ref_vae_compile=true with latent_cache='cache': no reference VAE encodes"):
        load_config("test", ["ref_vae_compile=true", "use_ref_vae=true", "n_frames=9", "encoder_weight=0.1",
                             "crop_min_side=0", "latent_cache=cache"], check_paths=False)
    with pytest.raises(ConfigError, match=r"compile_backend='tensorrt': choose one of inductor, aot_eager, eager"):
        load_config("test", ["ref_vae_compile=true", "use_ref_vae=true", "n_frames=9", "encoder_weight=0.1",
                             "compile_backend=tensorrt"], check_paths=False)


def test_the_compiled_reference_encode_gives_the_eager_latents():
    torch.manual_seed(0)
    reference = ReferenceVAE(tiny_reference_vae("cogvideox"), "cogvideox", sample_latents=True)
    video = torch.rand(1, 9, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    eager = reference.encode(video, torch.Generator().manual_seed(2))
    graphs = []

    def counting_backend(graph, example_inputs):  # a real dynamo graph, run as traced
        graphs.append(graph)
        return graph.forward

    compiled = reference.compile_encode(counting_backend).encode(video, torch.Generator().manual_seed(2))
    assert graphs  # the VAE's encode went through torch.compile
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compile_through_the_training_entry(tmp_path):
    """One rank through training/taehv_train.py with the student and the reference encode compiled
    (aot_eager), a cuDNN failure injected inside the compiled forward at micro-step 2 and non-finite
    outputs at micro-step 3: both skipped, train.log says once how long the first micro-step took
    against the next ones, the artefacts go to <XDG_CACHE_HOME>/taehv/inductor, and nothing
    compiles again after the first micro-step (a hook the graph guarded on would recompile each one)."""
    from training.data.synthetic_clips import make_sample_videos

    torch.manual_seed(0)
    tiny_reference_vae("cogvideox").save_pretrained(str(tmp_path / "vae" / "vae"))
    make_sample_videos(tmp_path / "clips", count=6, n_frames=24)
    env = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), XDG_CACHE_HOME=str(tmp_path / "xdg"), TORCH_LOGS="recompiles",
               TAEHV_FAULT_CUDNN_ERROR_MICRO_STEPS="2", TAEHV_FAULT_NONFINITE_MICRO_STEPS="3")
    sets = [f"data_root={tmp_path / 'clips'}", "compile=true", "compile_backend=aot_eager", "use_ref_vae=true",
            f"ref_vae_path={tmp_path / 'vae'}", "ref_vae_compile=true", "n_frames=9", "encoder_weight=0.1",
            "decoder_weight=0.1"]
    result = subprocess.run([sys.executable, str(REPO_ROOT / "training" / "taehv_train.py"), "--config", "test",
                             "--output-dir", str(tmp_path / "run"), "--max-steps", "2", *[a for s in sets for a in ("--set", s)]],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:]
    log = (tmp_path / "run" / "train.log").read_text()
    assert "out of memory on rank 0 at micro-step 2 (step 2): skipped on all ranks" in log
    assert "non-finite loss on rank 0 at micro-step 3 (step 2): skipped on all ranks" in log
    lines = re.findall(r"compile \(student and reference encode, backend aot_eager\): first micro-step \d+\.\d s \(compiling\), "
                       r"then \d+\.\d\d s \(mean of the next (\d+)\); compiled artefacts in (.*)\n", log)
    assert lines == [("3", str(tmp_path / "xdg" / "taehv" / "inductor"))], log
    after_first = result.stdout.partition("Step 1/2 |")[2].partition("Step 2/2 |")[0]
    assert after_first and "Recompiling" not in after_first, after_first[-3000:]
