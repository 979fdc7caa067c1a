"""The soak's CI form: the real launcher on 2 CPU processes, killed during checkpoint writes,
losing its torchrun agent, preempted with SIGTERM, restarted with --resume auto each time, must end with
the weights of an uninterrupted run. Seraena is on and two batches have a NaN loss in every run, so
this is also the exact-resume test: each rank's replay buffer and random state come back, and the
data position follows batches, not steps. (It replaces separate SIGTERM, SIGKILL-during-save and
exact-resume tests: the soak does all three, with 2 processes, and checks more.)"""

import json
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT


@pytest.mark.slow
def test_soak_survives_every_fault_without_losing_a_step(tmp_path):
    out = tmp_path / "soak.json"
    result = subprocess.run([sys.executable, "-m", "scripts.soak", "--minutes", "10", "--faults", "4", "--max-steps", "16",
                             "--work-dir", str(tmp_path / "work"), "--json", str(out)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    # a soak that stopped on an error writes no report: show why
    assert out.is_file(), (result.returncode, result.stdout[-3000:], result.stderr[-5000:])
    report = json.loads(out.read_text())
    assert result.returncode == 0, (report, result.stderr[-3000:])
    kinds = [fault["kind"] for fault in report["faults"]]
    # a kill mid-save, a lost agent, a preemption, a crashed rank
    assert kinds == ["checkpoint_write", "sigkill_agent", "sigterm", "sigkill_rank"], kinds
    assert report["faults_survived"] == report["faults_injected"] == 4
    assert report["steps_lost"] == 0 and report["half_written_checkpoints_selected"] == 0
    assert report["loss_mismatches"] == 0 and report["steps_never_logged"] == 0 and report["orphaned_processes"] == 0
    assert report["final_weights_equal"] and all(report["final_weights_equal"])
    for fault in report["faults"]:  # preemption exits 143 after its checkpoint (a scheduler restarts it); kills otherwise
        assert (fault["exit_code"] == 143) == (fault["kind"] == "sigterm") and fault["exit_code"] != 0, fault
    # the NaN batches were skipped, and every resume restored each rank's own Seraena state
    work = tmp_path / "work"
    assert "non-finite loss on ranks 0, 1 at micro-step 11 (step 10): skipped on all ranks" in (work / "uninterrupted" / "train.log").read_text()
    restarts = [path.read_text() for path in work.glob("cycle-*-attempt-*.out") if not path.name.endswith("-attempt-0.out")]
    resumes = [line for text in restarts for line in text.splitlines() if re.search(r"resumed from \S+ at step [1-9]", line)]
    assert resumes and all(line.endswith("Seraena replay buffer and random state per rank") for line in resumes), resumes
    newest = max((work / "uninterrupted" / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    ranks = [torch.load(newest / f"seraena_rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert ranks[0]["rng"] != ranks[1]["rng"] and len(ranks[1]["buffer"]["shapes"]) > 0
