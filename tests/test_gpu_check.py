"""`make gpu-check`'s schedule on the CPU with stand-in phases (real subprocesses, a few seconds in
all): phases in order under one deadline, a phase that does not fit skipped and named, one running
at the deadline stopped with its children, the report rewritten around every phase so a check
killed midway keeps what ran; and the launch phase's offline inputs built and loaded."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT

from scripts import gpu_check
from scripts.gpu_check import Phase, run_phases


def shell(key: str, script: str, estimate_s: float = 0) -> Phase:
    return Phase(key, f"stand-in {key}", estimate_s, ["sh", "-c", script])


def report_of(out: Path) -> dict:
    return json.loads((out / "gpu_check.json").read_text())


def new_report() -> dict:
    return {"device": "a stand-in", "torch": torch.__version__, "date": "today", "budget_s": 60}


def test_phases_run_in_order_and_one_that_does_not_fit_the_time_left_is_skipped_and_named(tmp_path):
    order = tmp_path / "order"
    launch_like = json.dumps({"random_weights": ["reference VAE (cogvideox, its published architecture)"]})
    phases = [Phase("first", "stand-in first", 0, ["sh", "-c", f"printf first, >> {order}; echo '{launch_like}' > {tmp_path / 'first.json'}"],
                    writes_json=True), shell("long", f"printf long, >> {order}", estimate_s=3600),
              shell("failing", f"printf failing, >> {order}; echo 'the reason'; exit 3"),
              shell("last", f"printf last >> {order}")]
    report = run_phases(phases, tmp_path, time.monotonic() + 60, new_report())
    assert order.read_text() == "first,failing,last"
    assert [entry["status"] for entry in report["phases"]] == ["passed", "skipped for time", "failed", "passed"]
    assert report["skipped_for_time"] == ["long"] and report_of(tmp_path) == report
    assert report["phases"][2]["exit"] == 3 and report["phases"][2]["last_line"] == "the reason"
    assert gpu_check.problems(report) == [f"failing: failed: the reason (output: {tmp_path / 'failing.log'})"]
    text = (tmp_path / "gpu_check.md").read_text()
    assert "| stand-in long | skipped for time | - (3600) |" in text and "Skipped for time: long" in text
    assert "random weights in the launch: reference VAE (cogvideox, its published architecture)" in text


def ended(pid: int, within_s: float = 5.0) -> bool:
    """The process is gone (or a zombie) within `within_s`: a SIGKILL is delivered when the process
    is next scheduled, which on a loaded machine comes after the killer returns."""
    status, deadline = Path(f"/proc/{pid}/status"), time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if "zombie" in status.read_text():
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_phase_running_at_the_deadline_is_stopped_with_the_processes_it_started(tmp_path):
    """A launch's ranks and data workers are the phase's children: they end with it, and the phases
    after it that no longer fit are skipped."""
    child = tmp_path / "child.pid"
    phases = [shell("sleeper", f"sleep 60 & echo $! > {child}; wait"), shell("after", "true", estimate_s=1)]
    report = run_phases(phases, tmp_path, time.monotonic() + 1.5, new_report())
    assert [entry["status"] for entry in report["phases"]] == ["stopped at the deadline", "skipped for time"]
    assert report["phases"][0]["exit"] is None
    assert ended(int(child.read_text())), "the phase's child still runs"


DRIVER = """
import sys, time
from pathlib import Path
from scripts.gpu_check import Phase, run_phases, stop_on_sigterm
out = Path(sys.argv[1])
stop_on_sigterm()
phases = [Phase("first", "first", 0, ["sh", "-c", "echo done"]),
          Phase("second", "second", 0, ["sh", "-c", sys.argv[2]]),
          Phase("third", "third", 0, ["sh", "-c", f"touch {out / 'third_ran'}"])]
run_phases(phases, out, time.monotonic() + 60, {"device": "cpu", "torch": "-", "date": "-", "budget_s": 60})
"""


@pytest.mark.parametrize("signal_name, second_status", [("KILL", "running"), ("TERM", "stopped from outside")])
def test_a_check_stopped_from_outside_keeps_the_phases_that_ran(tmp_path, signal_name, second_status):
    """The second phase stops the check itself (SIGKILL: nothing can run after it; SIGTERM: the check
    stops its phase and says so): the report on disk keeps the first phase's result."""
    child = tmp_path / "child.pid"
    completed = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path), f"sleep 60 & echo $! > {child}; "
                                f"kill -{signal_name} $PPID; wait"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert completed.returncode == (-9 if signal_name == "KILL" else 143), completed.stderr
    report = report_of(tmp_path)
    assert [entry["status"] for entry in report["phases"]] == ["passed", second_status, "pending"]
    assert report["phases"][0]["exit"] == 0 and not (tmp_path / "third_ran").exists()
    assert "| first | passed |" in (tmp_path / "gpu_check.md").read_text()
    pid = int(child.read_text())
    if signal_name == "KILL":  # nothing was left to stop it: the test does
        os.kill(pid, signal.SIGKILL)
    else:
        assert ended(pid), "the stopped phase's child still runs"


def test_every_phase_but_compile_parity_fits_the_default_budget_most_valuable_first(tmp_path):
    """The estimates (measured on an H100) of every phase but the last fit 480 s together; the launch
    first, compile parity (over 230 s on an H100) last; the two pytest phases leave out the profile
    benchmark, which phases of its own run, and the first also the memory estimate against the peak,
    which the launch checks at the profile's full shape."""
    phases = gpu_check.phases(tmp_path)
    assert sum(phase.estimate_s for phase in phases[:-1]) <= gpu_check.DEFAULT_BUDGET_S
    assert [phase.key for phase in phases[:2]] == ["launch", "notebook"] and phases[-1].key == "compile_parity"
    selections = [phase.command[phase.command.index("-k") + 1] for phase in phases if "-k" in phase.command]
    assert selections == ["not fast_path_keys and not benchmark_of_the_h100_profile and not memory_estimate",
                          "fast_path_keys"]


@pytest.mark.slow
def test_the_launch_phase_needs_no_download(tmp_path, monkeypatch):
    """Without the reference VAE's folder or the LPIPS files, the launch phase builds the family's
    diffusers class with random weights (a tiny config here) and random LPIPS files, says so, and
    they load as a run loads them; its 1gpu_h100 launch resolves here with every loss term on."""
    from models.metrics import load_lpips
    from models.reference_vae import load_reference_vae
    from scripts.gpu_check_launch import EVERY_TERM, SHORT_RUN, offline_inputs, peak_against_plan
    from training.config.load import load_config
    from training.config.terms import LOSS_TERMS, active_terms

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = [f"ref_vae_path={tmp_path / 'no_vae'}", f"lpips_backbone_path={tmp_path / 'none.pth'}",
               f"lpips_weights_path={tmp_path / 'none.pth'}"]
    config = load_config("test", ["use_ref_vae=true", "ref_vae_family=cogvideox", "n_frames=9", *missing], check_paths=False)
    sets, random = offline_inputs(config, tmp_path / "inputs", tiny=True, clips=2)
    assert [line.split(" (")[0] for line in random] == ["reference VAE", "LPIPS"], random
    values = dict(item.split("=", 1) for item in sets)
    reference = load_reference_vae("cogvideox", values["ref_vae_path"], torch.device("cpu"))
    assert reference.encode(torch.rand(1, 9, 3, 32, 32)).isfinite().all()
    load_lpips(values["lpips_backbone_path"], values["lpips_weights_path"])
    assert len(list(Path(values["data_root"]).glob("*.mp4"))) >= 2

    launch = load_config("1gpu_h100", [*EVERY_TERM, *SHORT_RUN, *sets], num_processes=1, check_paths=False)
    assert {term.name for term in active_terms(launch)} == {term.name for term in LOSS_TERMS}
    assert launch.zero_stage == 0 and launch.mixed_precision == "bf16" and (launch.height, launch.width) == (480, 720)
    assert launch.global_batch_size == 2 * launch.batch_size_per_gpu
    # the H100's figures (2026-11-26): 54.9 GB against a plan of 53.9 GB with its 1.5 GB of CUDA context
    assert peak_against_plan(54.9, 53.9, 1.5)[1] == ""
    assert "above the plan's 52.4 GB" in peak_against_plan(62.0, 53.9, 1.5)[1]
    assert "below the plan's 52.4 GB" in peak_against_plan(43.0, 53.9, 1.5)[1]


def test_a_phase_this_machine_cannot_run_is_skipped_and_named_and_the_rest_run(tmp_path, monkeypatch):
    """The notebook phase without checkouts of its upstream files: skipped with the reason in the
    report, not failed; the next phase runs."""
    monkeypatch.setenv("TAEHV_UPSTREAM_DIR", str(tmp_path / "no_taehv"))
    monkeypatch.setenv("SERAENA_UPSTREAM_DIR", str(tmp_path / "no_seraena"))
    notebook = next(phase for phase in gpu_check.phases(tmp_path) if phase.key == "notebook")
    after = Phase("after", "after", 1, [sys.executable, "-c", "pass"])
    report = gpu_check.run_phases([notebook, after], tmp_path, deadline=time.monotonic() + 60,
                                  report={"device": "test", "torch": torch.__version__, "budget_s": 60, "date": "today"})
    skipped, ran = report["phases"]
    assert skipped["status"] == "skipped" and "no_taehv/taehv.py" in skipped["note"] and ran["status"] == "passed"
    assert not gpu_check.problems(report)
    assert "madebyollin/taehv" in gpu_check.markdown(report)
