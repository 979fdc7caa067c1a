"""Shared test helpers. ../shared (reference specs, sample videos) is optional: tests that need it
skip with a reason when it is absent, so a fresh clone passes."""

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
REFERENCE = SHARED / "reference"
SAMPLE_VIDEOS = SHARED / "data" / "videos"


# DeepSpeed without a GPU compiles its shared-memory op with the C++ compiler torch uses (CXX or c++).
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None,
    reason="DeepSpeed on CPU compiles a C++ op: no C++ compiler (CXX or c++) on PATH",
)


def load_reference_json(name: str) -> dict:
    path = REFERENCE / name
    if not path.is_file():
        pytest.skip(f"{path} not present (../shared is optional for a fresh clone)")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def taehv_spec() -> dict:
    return load_reference_json("taehv_state_dict_spec.json")


@pytest.fixture(scope="session")
def seraena_spec() -> dict:
    return load_reference_json("seraena_state_dict_spec.json")


def free_port() -> int:
    """An unused local TCP port for one launch's MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def test_process_keeps_normal_scheduling():
    """Some encoders (SVT-AV1 as root) switch their process to real-time scheduling; every later
    subprocess would inherit it and busy-waiting ranks would starve each other on a small machine."""
    yield
    if hasattr(os, "sched_getscheduler"):
        assert os.sched_getscheduler(0) == os.SCHED_OTHER, "this test left the test process on real-time scheduling"
