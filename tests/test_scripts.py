import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT


def test_benchmark_model_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run(
        [sys.executable, "-m", "scripts.benchmark_model", "--height", "32", "--width", "48", "--frames", "5",
         "--repeats", "1", "--warmup", "0", "--mode", "sequential", "--json", str(out)],
        cwd=REPO_ROOT, check=True, capture_output=True,
    )
    result = json.loads(out.read_text())
    assert result["latents"] == [1, 2, 16, 4, 6] and result["decoded"] == [1, 5, 3, 32, 48]
    assert result["encode_frames_per_s"] > 0 and result["decode_frames_per_s"] > 0
    assert result["peak_memory_kind"] == "cpu_peak_rss_growth"


def test_selfcheck_passes():
    completed = subprocess.run(
        [sys.executable, "-m", "scripts.selfcheck"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "self-check passed" in completed.stdout


def test_validate_setup_table(tmp_path):
    script = str(REPO_ROOT / "scripts" / "validate_setup.sh")
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "MASTER_PORT": "29517"}
    ok = subprocess.run([script, "1", "cpu", "--set", f"output_dir={tmp_path}"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS  config" in ok.stdout and "0 FAIL" in ok.stdout
    bad = subprocess.run([script, "8", "h100"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1
    assert re.search(r"FAIL  config +pretrained_model_path='checkpoints/taecvx.pth' does not exist", bad.stdout)
    assert "WARN  GPUs" in bad.stdout  # a CPU machine warns about GPUs instead of failing


def test_validate_setup_without_arguments_checks_the_machine(tmp_path):
    script = str(REPO_ROOT / "scripts" / "validate_setup.sh")
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "MASTER_PORT": "29518"}
    result = subprocess.run([script, "--set", f"output_dir={tmp_path}"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    # The GPU row describes the machine, not the cpu profile's "no GPU needed".
    gpus = re.search(r"^(PASS|WARN)  GPUs +(.*)$", result.stdout, re.M)
    assert gpus and "CPU profile" not in gpus.group(2)
    assert ("PASS  NCCL" in result.stdout) == torch.cuda.is_available()
    assert "PASS  codecs" in result.stdout and "H.264, HEVC, AV1" in result.stdout  # the requirements' PyAV wheel
    assert "PASS  config" in result.stdout and "cpu:" in result.stdout


def test_validate_setup_codecs_row_names_what_is_missing(monkeypatch):
    import av

    from scripts.validate_setup import Report, check_codecs

    real = av.codec.Codec

    def only_native_av1(name, mode="r"):
        if name != "av1":
            raise ValueError(name)
        return real(name, mode)

    monkeypatch.setattr(av.codec, "Codec", only_native_av1)
    report = Report()
    check_codecs(report)
    ((status, check, detail),) = report.rows
    assert (status, check) == ("FAIL", "codecs")
    assert "H.264, HEVC, AV1" in detail and "native av1 decoder" in detail


def test_training_step_benchmark_writes_phases_and_plot(tmp_path):
    from training.data.synthetic_clips import make_sample_videos

    make_sample_videos(tmp_path / "clips", count=4, n_frames=16)
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    completed = subprocess.run(
        [sys.executable, "-m", "scripts.benchmark", "--steps", "2", "--warmup", "1", "--batch", "1", "--skip-launches",
         "--data-root", str(tmp_path / "clips"), "--json", str(out), "--plot", str(plot)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["phases_s"]) == {"reference_vae", "student_forward", "seraena", "backward", "optimizer", "bare_step"}
    assert all(v > 0 for v in result["phases_s"].values())
    assert result["student_flops_per_step"] > 1e8 and result["mfu"] is None  # MFU is reported on GPU only
    if not torch.cuda.is_available():  # the step it timed, against the fastest kernel of this CPU in its dtype
        assert 0 < result["mfu_vs_measured_peak"] <= 1, (result["mfu_vs_measured_peak"], result["measured_peak_kernel"])
    assert set(result["bare_step_variants_s"]) == {"fp32", "channels_last", "bf16_autocast"}
    distillation = result["distillation"]  # a real cache was written over the clips and read back
    assert set(distillation["step_s"]) == {"student_only", "from_cache", "on_the_fly"} and distillation["cached_samples"] > 0
    assert result["cache_vs_student_only"] == distillation["step_s"]["from_cache"] / distillation["step_s"]["student_only"]
    assert plot.stat().st_size > 1000


def test_profile_benchmark_counts_the_whole_h100_step_without_running_it(tmp_path):
    out = tmp_path / "h100.json"
    completed = subprocess.run([sys.executable, "-m", "scripts.benchmark", "--profile", "h100", "--dry-run", "--json", str(out)],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["shape"] == {"batch_per_gpu": 4, "frames": 9, "height": 480, "width": 720, "variant": "taecvx",
                               "precision": "bf16"}
    parts = report["flops_per_micro_step"]
    assert set(parts) == {"student", "lpips", "seraena", "reference", "optimizer", "total"}
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    assert parts["reference"] > parts["student"] > parts["seraena"] > parts["lpips"] > 0  # the VAE dominates on the fly
    assert report["device"].startswith("none (dry run")


def test_profile_benchmark_times_the_trainers_window_and_each_part_of_it(tmp_path):
    """The h100 step as the trainer runs it (its builders, Seraena's cadence: one discriminator
    update per window of 2 micro-steps), at 1 x 9 x 32 x 48 with the reference VAE on the fly, in
    fp32 (bf16 runs ~30x slower on a CPU; test_cuda_rules runs this step in bf16): it reports per
    micro-step. With --kernels on this CPU (perf_counter, the CPU profiler) every part the step marks
    is timed without the parts inside it (the student and LPIPS inside the losses), so together they
    make the measured step; the top kernels are named; the table, with each part's floor, is
    written beside the JSON."""
    from scripts.step_parts import PARTS

    out = tmp_path / "kernels.json"
    sets = ("height=32", "width=48", "batch_size_per_gpu=1", "gradient_accumulation_steps=2", "global_batch_size=16",
            "accelerate_config=ddp_cpu.yaml")
    completed = subprocess.run([sys.executable, "-m", "scripts.benchmark", "--profile", "h100", *[a for s in sets for a in ("--set", s)],
                                "--steps", "1", "--warmup", "1", "--kernels", "--json", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["step_s"] > 0 and report["clips_per_s_per_gpu"] == pytest.approx(1 / report["step_s"])
    assert 0 < report["mfu_vs_measured_peak"] <= 1, (report["mfu_vs_measured_peak"], report["measured_peak_kernel"])
    parts = report["parts_s"]
    assert list(parts) == list(PARTS) and all(seconds > 0 for seconds in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(report["step_s"], rel=0.1), (parts, report["step_s"])
    cuda = torch.cuda.is_available()
    assert report["parts_timer"] == ("CUDA events" if cuda else "perf_counter")
    assert report["kernel_timer"].startswith("CUDA time" if cuda else "self CPU time")
    kernels = report["top_kernels"]
    assert kernels and all(k["name"].strip() and k["calls"] > 0 and k["ms_per_micro_step"] > 0 for k in kernels), kernels
    if not cuda:  # aten ops by name: a convolution network's time is in its convolutions
        assert any("convolution" in k["name"] for k in kernels[:3]), kernels[:3]
    table = out.with_suffix(".md").read_text()
    floor_ms = report["predicted_floor_s"]["reference"] * 1e3
    assert f"| reference VAE encode | {parts['reference_encode'] * 1e3:.2f} |" in table and f"| {floor_ms:.3g} |" in table
    assert f"`{kernels[0]['name']}`" in table and table in completed.stderr


def test_the_peak_and_the_step_count_convolutions_alike_and_the_peak_takes_the_fastest_kernel(monkeypatch):
    """MFU above 1 came from a peak below what the step's own kernels reach: MKL's fp32 matmul
    against oneDNN's convolutions, counted with their zero padding. A convolution is counted without
    the products of its padding, and the measured peak is the fastest of a matmul and convolutions
    at the student's widths, counted the same way. (Deterministic: which kernel is fastest on a
    shared machine is the benchmark's to measure, not a timed assert's.)"""
    import torch.nn.functional as F

    from scripts import benchmark
    from training.plan.step_flops import count_flops

    x, w = torch.rand(2, 4, 8, 8), torch.rand(5, 4, 3, 3)
    taps = (3 * 8 - 2) ** 2  # per output row and column, the 3x3 window loses one tap at each edge
    assert count_flops(lambda: F.conv2d(x, w, padding=1)) == 2 * 2 * 5 * 4 * taps
    calls = []

    def timed(device, fn, repeats):  # the matmul (timed first) takes 1 s, each convolution 10 ms
        calls.append(fn)
        return 1.0 if len(calls) == 1 else 0.01

    monkeypatch.setattr(benchmark, "best_seconds", timed)
    peak, label = benchmark.measured_peak_flops(torch.device("cpu"))
    assert len(calls) == 3 and "3x3 convolution" in label and peak > 2 * 2048**3  # above the matmul's 2n^3 FLOP in 1 s


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_gpu_check_stops_with_one_line_without_cuda(tmp_path):
    completed = subprocess.run([sys.executable, "-m", "scripts.gpu_check", "--out", str(tmp_path / "out")],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2 and completed.stderr.count("\n") == 1, completed.stderr
    assert "gpu-check: needs a CUDA GPU" in completed.stderr and not (tmp_path / "out").exists()


def test_the_teacher_benchmark_times_both_layouts_and_says_which_to_use(tmp_path):
    """scripts/benchmark_teacher.py (a make gpu-check phase) on the tiny CogVideoX config: both
    layouts timed, the faster one named as the setting, and its row in gpu-check's table."""
    from scripts import gpu_check

    out = tmp_path / "teacher.json"
    completed = subprocess.run([sys.executable, "-m", "scripts.benchmark_teacher", "--profile", "test", "--tiny", "--set",
                                "use_ref_vae=true", "--set", "ref_vae_family=cogvideox", "--set", "n_frames=9",
                                "--warmup", "1", "--repeats", "2", "--json", str(out)],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["encode_s"]) == {"default", "channels_last_3d"} and all(v > 0 for v in result["encode_s"].values())
    faster = min(result["encode_s"], key=result["encode_s"].get)
    assert result["use"] == f"ref_vae_channels_last={str(faster == 'channels_last_3d').lower()}"
    assert gpu_check.teacher_row(result).endswith(f"use {result['use']}")


def test_transposed_convolutions_are_counted_with_torchs_formula():
    """The FLOP counter leaves zero padding out of ordinary convolutions and falls back on torch's
    own formula for transposed ones (a student or teacher that has them must not break the dry run)."""
    import torch.nn.functional as F

    from training.plan.step_flops import count_flops

    x, w = torch.rand(1, 4, 8, 8), torch.rand(4, 2, 3, 3)
    assert count_flops(lambda: F.conv_transpose2d(x, w)) == 2 * 4 * 2 * 9 * 64  # every input tap, every weight


def test_data_benchmark_decode_cost_reports_raw_and_prepared(tmp_path):
    """The decode budget part of scripts/benchmark_data.py at a small size (one short 1080p source):
    both clip sets measured, at the h100 clip shape."""
    out = tmp_path / "data.json"
    completed = subprocess.run([sys.executable, "-m", "scripts.benchmark_data", "--decode-cost-only", "--sources", "1",
                                "--source-frames", "60", "--cost-clips", "3", "--json", str(out)],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["core_s_per_clip"]) == set(result["clips_per_s_per_worker"]) == {"raw", "prepared"}
    assert all(v > 0 for v in result["core_s_per_clip"].values())
    assert result["prepared_over_raw"] == pytest.approx(result["core_s_per_clip"]["prepared"] / result["core_s_per_clip"]["raw"], rel=0.01)
    assert result["decode_cost_clip"].startswith("9 frames of 480x720") and result["prepared_clips"] >= 1


def test_the_notebook_benchmark_names_the_missing_upstream_file_in_one_line(tmp_path):
    """Without checkouts of madebyollin/taehv and madebyollin/seraena there is nothing to compare
    with: one line names the file and the fix, before any model is built."""
    completed = subprocess.run([sys.executable, "-m", "scripts.benchmark_notebook", "--taehv-dir", str(tmp_path / "taehv"),
                                "--seraena-dir", str(tmp_path / "seraena")], cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 1
    assert completed.stderr.strip() == (f"{tmp_path / 'taehv' / 'taehv.py'} not found: point --taehv-dir / --seraena-dir at "
                                        "checkouts of madebyollin/taehv and madebyollin/seraena (or set TAEHV_UPSTREAM_DIR / "
                                        "SERAENA_UPSTREAM_DIR)")


def test_the_host_count_tells_kernels_views_and_syncs_apart_by_part(monkeypatch):
    """scripts/host_cost.py's counter (benchmark_notebook --host): ops that launch a kernel, views and
    allocations that do not, reads of a device value as syncs, each in the part it ran in; nothing
    outside the counted window; torch.optim's host-side step counters are not syncs."""
    from deepspeed.accelerator import get_accelerator

    from scripts.host_cost import HOST_READS, HostCounter, counter_overhead_s

    for name in HOST_READS:  # patch_reads replaces these for the process: restored after the test
        monkeypatch.setattr(torch.Tensor, name, getattr(torch.Tensor, name))
    monkeypatch.setattr(torch.cuda, "synchronize", torch.cuda.synchronize)
    monkeypatch.setattr(type(get_accelerator()), "synchronize", type(get_accelerator()).synchronize)
    counter = HostCounter()
    counter.patch_reads()
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.AdamW([weight], foreach=False)  # reads its host step counter with .item()
    with counter:
        torch.ones(3) * 2  # not counted: outside the window
        counter.counting = True
        counter.start_step()
        with counter.part("forward"):
            x = torch.empty(4).fill_(1.0)  # empty: no kernel; fill_: one
            y = x.view(2, 2).t()  # two views
            total = (y * 3).sum()  # two kernels
        with counter.part("read"):
            value = total.item()  # a sync
            y.tolist()  # a sync
        with counter.part("optimizer"):
            weight.grad = torch.ones(4)
            optimizer.step()
        counter.counting = False
    assert value == 12.0
    assert counter.kernels["forward"] == 3 and counter.views["forward"] == 2
    assert sum(n for where, n in counter.syncs.items() if where.startswith("read: ")) == 2
    assert not any(where.startswith("optimizer: ") for where in counter.syncs), counter.syncs
    assert counter.kernels["optimizer"] > 0 and "other" not in counter.kernels
    assert counter.ops_in_step == [sum(counter.dispatched.values())] and counter.op_seconds[0] > 0
    report = counter.per_step(1, 1, [counter.op_seconds[0] + 1.0], counter_overhead_s())  # a step of 1 s of the thread's CPU outside its ops
    assert 0 < 1000 - report["host_ms_per_step"] < 1, report  # less the counter's own few microseconds per op


def test_the_host_count_runs_both_sides_as_a_user_launches_it(tmp_path):
    """benchmark_notebook --host end to end, as scripts/host_cost.py's host_costs runs it: our trainer
    launched by accelerate (training/base/launch.py) on the 1gpu_h100 profile, the notebook's step
    beside it. Upstream's files are stood in for by tests/notebook_standin (our TAEHV and Seraena
    under upstream's names) and the Wan VAE is a tiny one: the comparison's plumbing, not its figures."""
    from models.reference_vae import tiny_reference_vae_config, vae_class
    from scripts.host_cost import host_costs

    vae_folder = tmp_path / "wan"
    vae_class("wan")(**tiny_reference_vae_config("wan")).save_pretrained(str(vae_folder / "vae"))
    standin = REPO_ROOT / "tests" / "notebook_standin"
    costs = host_costs("1gpu_h100", vae_folder, tmp_path, ["max_steps=4"], (standin, standin))  # 2 warm-up, 2 counted
    ours, notebook = costs["ours"], costs["notebook"]
    for side in (ours, notebook):
        assert len(side["host_ms_by_step"]) == 2 and side["kernel_ops_per_step"] > side["syncs_per_step"]
        assert {"reference_encode", "student_forward", "backward", "optimizer", "ema"} <= set(side["kernel_ops_by_part"]), side
    assert ours["syncs_per_step"] <= 2, ours["syncs_by_where"]  # the goal: one agreement read per step
    assert notebook["syncs_per_step"] >= 200, notebook["syncs_by_where"]  # its AveragedModel reads each parameter's count
    assert ours["engine"] == "ddp_gpu_bf16.yaml (ZeRO 0, bf16)" and costs["ours_over_notebook_host_ms"] > 0


def test_the_multi_process_host_count_gives_each_rank_per_optimizer_step(tmp_path):
    """benchmark_notebook --host --processes 2 as multi_process_costs runs each engine: h100's step on 2
    CPU processes under DDP (its default engine), at the notebook's recipe with a tiny Wan VAE and 2
    micro-steps per optimizer step: one report per rank, per optimizer step (both micro-steps counted,
    DDP's all-reduce in the window's last), no sync but the agreement's one read at the window's end."""
    from models.reference_vae import tiny_reference_vae_config, vae_class
    from scripts.host_cost import ENGINES, host_costs, our_config_sets, sample_clips

    vae_folder = tmp_path / "wan"
    vae_class("wan")(**tiny_reference_vae_config("wan")).save_pretrained(str(vae_folder / "vae"))
    sets = [*our_config_sets(vae_folder, sample_clips(tmp_path)), "batch_size_per_gpu=2", "gradient_accumulation_steps=2", "max_steps=3"]
    costs = host_costs("h100", vae_folder, tmp_path, [f"accelerate_config={ENGINES['ddp']}"], None, processes=2, sets=sets)
    ours, ranks = costs["ours"], costs["ranks"]
    assert ours["engine"] == "ddp_gpu_bf16.yaml (ZeRO 0, bf16)" and len(ranks) == 2 and len(ours["host_ms_by_step"]) == 1
    assert ours["kernel_ops_per_step"] == 2 * ours["kernel_ops_per_micro_step"]
    assert ranks[0]["kernel_ops_per_step"] == ranks[1]["kernel_ops_per_step"]  # DDP: every rank runs the same step
    assert all(rank["syncs_per_step"] == 1 for rank in ranks), ours["syncs_by_where"]  # the agreement's, at the window's end
    assert {"reference_encode", "student_forward", "backward", "optimizer", "ema"} <= set(ours["kernel_ops_by_part"])


def test_compare_recipes_table_gives_each_candidate_at_each_size_beside_the_block_average():
    from types import SimpleNamespace

    from scripts.compare_recipes import markdown, parse_candidate, parse_sizes

    assert parse_candidate("mixed chroma_weight=50 half_size_every=2") == ("mixed", ["chroma_weight=50", "half_size_every=2"])
    with pytest.raises(SystemExit, match="expected a name, then KEY=VALUE items"):
        parse_candidate("mixed chroma_weight")
    sizes = parse_sizes("32x32,64x64")
    mean = {"psnr": 21.0, "chroma_psnr": 34.0, "colourfulness_ratio": 0.9}
    blur = {"psnr": 19.5, "chroma_psnr": 34.9, "colourfulness_ratio": 0.8}
    result = {"recipe": "mixed", "sets": ["chroma_weight=50"], "steps": 800, "train_wall_s": 586.2, "cpu_minutes": 9.0,
              "notes": [], "scores": {size: {"clips": 7, "mean": mean, "baseline": blur} for size in ("32x32", "64x64")}}
    args = SimpleNamespace(profile="cpu", ngpu=1, steps=500, frames=8, sizes=sizes, recipes="", seed=42, write_docs=False,
                           candidate=["mixed chroma_weight=50"], set=[])
    table = markdown([result], args)
    assert "| `mixed` (`chroma_weight=50`) | 800 | 9 m 46 s | 21.00 | 34.00 | 0.90 |" in table
    assert "PSNR (dB) at 64x64" in table and "| 8x8 block average (no model) | - | - | 19.50 | 34.90 | 0.80 |" in table
    assert "--sizes 32x32,64x64 --candidate 'mixed chroma_weight=50'" in table
