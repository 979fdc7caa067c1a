"""The soak's CI form: the real launcher on 2 CPU processes, killed during checkpoint writes,
losing its torchrun agent, preempted with SIGTERM, restarted with --resume auto each time, must end with
the weights of an uninterrupted run. (It replaces separate SIGTERM and SIGKILL-during-save tests:
the soak does both, with 2 processes, and checks more.)"""

import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


@pytest.mark.slow
def test_soak_survives_every_fault_without_losing_a_step(tmp_path):
    out = tmp_path / "soak.json"
    result = subprocess.run([sys.executable, "-m", "scripts.soak", "--minutes", "10", "--faults", "4", "--max-steps", "24",
                             "--work-dir", str(tmp_path / "work"), "--json", str(out)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    report = json.loads(out.read_text())
    assert result.returncode == 0, (report, result.stderr[-3000:])
    kinds = [fault["kind"] for fault in report["faults"]]
    # a kill mid-save, a lost agent, a preemption, a crashed rank
    assert kinds == ["checkpoint_write", "sigkill_agent", "sigterm", "sigkill_rank"], kinds
    assert report["faults_survived"] == report["faults_injected"] == 4
    assert report["steps_lost"] == 0 and report["half_written_checkpoints_selected"] == 0
    assert report["loss_mismatches"] == 0 and report["steps_never_logged"] == 0 and report["orphaned_processes"] == 0
    assert report["final_weights_equal"] and all(report["final_weights_equal"])
    for fault in report["faults"]:  # preemption is a clean exit; kills are not
        assert (fault["exit_code"] == 0) == (fault["kind"] == "sigterm"), fault
