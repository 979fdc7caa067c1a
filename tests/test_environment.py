"""The GPU environment (environment.yml) installs in one pip pass, with the tested torch and nothing
that needs a compiler; flash-attn and xformers are not part of it; `make gpu-check` uses a conda env
only when it is the project's (issue 31); a PyTorch container's torch is kept by an offline install
from `make wheelhouse` (issue 38).

The resolving tests ask the package index (`pip install --dry-run --report`, nothing installed) and
skip, saying why, when it cannot be reached. They ignore this machine's pip configuration (its
find-links, extra indexes and constraints), keeping only how pip reaches the index (PIP_INDEX_URL,
PIP_CERT, PIP_PROXY, ...): the result is what a GPU machine gets from PyPI.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT = ROOT / "environment.yml"
EXTRAS = ROOT / "requirements-gpu-extras.txt"
ATTENTION_LIBRARIES = {"flash-attn", "xformers"}
# sdists allowed in the GPU environment: PyPI has no wheel of them, and they build without a
# compiler, torch or CUDA (pure Python)
PURE_PYTHON_SDISTS = {"deepspeed": "DeepSpeed publishes only an sdist; its CUDA ops compile at first use"}
# pip settings that say how the index is reached, kept; every other PIP_* variable is dropped
PIP_REACH = {"PIP_INDEX_URL", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST",
             "PIP_DEFAULT_TIMEOUT", "PIP_RETRIES"}


def the_tested_torch() -> str:
    """The torch release the project was tested with: the Makefile's TORCH_SPEC default."""
    found = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile has no `TORCH_SPEC ?= torch==X` line"
    return found.group(1)


def environment() -> dict:
    return yaml.safe_load(ENVIRONMENT.read_text())


def environment_pip_lines() -> list[str]:
    """The lines of the pip section of environment.yml, which conda hands to one `pip install -r`."""
    for dependency in environment()["dependencies"]:
        if isinstance(dependency, dict) and "pip" in dependency:
            return [str(line) for line in dependency["pip"]]
    raise AssertionError("environment.yml has no pip section")


def _included_file(line: str, base: Path) -> tuple[str, Path] | None:
    """(option, absolute path) for a `-r FILE` / `-c FILE` line, else None."""
    found = re.match(r"^(-r|-c|--requirement|--constraint)[\s=]+(\S+)$", line.strip())
    if not found:
        return None
    option = "-r" if found.group(1) in ("-r", "--requirement") else "-c"
    return option, (base / found.group(2)).resolve()


def requirements(lines: list[str], base: Path) -> list[tuple[Requirement, str]]:
    """Every requirement the lines install, following -r files (relative to the file naming them,
    as pip does), with where it was read; constraint files (-c) install nothing and are skipped."""
    found = []
    for line in lines:
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        included = _included_file(line, base)
        if included:
            option, path = included
            if option == "-r":
                found += [(req, f"{path.name}: {where}") for req, where in
                          requirements(path.read_text().splitlines(), path.parent)]
            continue
        assert not line.startswith("-"), f"unexpected pip option in the GPU environment: {line!r}"
        found.append((Requirement(line), line))
    return found


def pip_environment() -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_") or key in PIP_REACH}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def require_index() -> None:
    """Skip, saying why, when the package index does not answer."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/torch/", timeout=20) as answer:
            answer.read(1)
    except (urllib.error.URLError, OSError) as error:
        pytest.skip(f"the package index {index} cannot be reached from here ({error}); "
                    "resolving the GPU environment needs it")


def dry_run(tmp_path: Path, lines: list[str], *options: str) -> list[dict]:
    """`pip install --dry-run --report` of the requirement lines (their -r/-c paths made absolute,
    as conda's temporary requirements file beside environment.yml resolves them): what pip would
    install into an empty environment. Thread-safe: the `resolutions` fixture runs two at once."""
    written = []
    for line in lines:
        included = _included_file(line, ENVIRONMENT.parent)
        written.append(f"{included[0]} {included[1]}" if included else line)
    requirement_file = tmp_path / "requirements.txt"
    requirement_file.write_text("\n".join(written) + "\n")
    report = tmp_path / "report.json"
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), *options, "-r", str(requirement_file)],
        capture_output=True, text=True, env=pip_environment(), cwd=tmp_path, timeout=300)
    assert completed.returncode == 0, (
        f"pip cannot resolve {written} ({' '.join(options)}):\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}")
    return json.loads(report.read_text())["install"]


def resolved(items: list[dict]) -> dict[str, tuple[Version, str]]:
    """{name: (version, file name)} of a pip report's install list."""
    return {canonicalize_name(item["metadata"]["name"]):
            (Version(item["metadata"]["version"]), item["download_info"]["url"].rsplit("/", 1)[-1])
            for item in items}


def cuda_majors(packages: dict[str, tuple[Version, str]]) -> set[int]:
    """The CUDA major versions of the resolved NVIDIA libraries (nvidia-*-cuNN names, and the
    cuda-toolkit / nvidia-cuda-runtime versions)."""
    majors = {int(m.group(1)) for name in packages if (m := re.match(r"nvidia-.*-cu(\d+)$", name))}
    majors |= {packages[name][0].major for name in ("cuda-toolkit", "nvidia-cuda-runtime") if name in packages}
    return majors


def test_the_gpu_environment_pins_the_tested_torch():
    """torch is pinned to exactly the tested release (`torch>=2.4` would let a resolver swap it)."""
    tested = the_tested_torch()
    torch_lines = [(req, where) for req, where in requirements(environment_pip_lines(), ENVIRONMENT.parent)
                   if canonicalize_name(req.name) == "torch"]
    pins = [where for req, where in torch_lines if str(req.specifier) == f"=={tested}"]
    assert pins, f"environment.yml installs torch from {[w for _, w in torch_lines]}, none of them torch=={tested}"
    assert environment()["name"] == "taehv"
    assert "python=3.11" in environment()["dependencies"]


def test_the_attention_libraries_are_optional_extras():
    """flash-attn and xformers are not in the GPU environment; xformers is in the extras file, which
    holds torch at the tested release, and the README gives its command."""
    installed = {canonicalize_name(req.name) for req, _ in requirements(environment_pip_lines(), ENVIRONMENT.parent)}
    assert not installed & ATTENTION_LIBRARIES, f"environment.yml installs {sorted(installed & ATTENTION_LIBRARIES)}"
    assert EXTRAS.is_file(), "requirements-gpu-extras.txt is missing"
    lines = EXTRAS.read_text().splitlines()
    extras = {canonicalize_name(req.name) for req, _ in requirements(lines, ROOT)}
    assert extras == {"xformers"}, extras
    constraints = [included[1] for line in lines if (included := _included_file(line, ROOT)) and included[0] == "-c"]
    constrained = {canonicalize_name(req.name): str(req.specifier) for path in constraints
                   for req, _ in requirements(path.read_text().splitlines(), path.parent)}
    assert constrained.get("torch") == f"=={the_tested_torch()}", constrained
    assert "pip install -r requirements-gpu-extras.txt" in (ROOT / "README.md").read_text()


def _gpu_check_python(conda_prefix: str, conda_env: str, *make_args: str) -> tuple[str, str]:
    """(the Python `make gpu-check` would run, what make printed first) for this active conda env,
    by `make -n` (nothing runs)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("CONDA_", "MAKE")) and key not in ("PY", "VENV", "GPU_ENV")}
    env.update(CONDA_PREFIX=conda_prefix, CONDA_DEFAULT_ENV=conda_env)
    completed = subprocess.run(["make", "-n", "gpu-check", *make_args], capture_output=True, text=True,
                               env=env, cwd=ROOT, timeout=60)
    assert completed.returncode == 0, completed.stderr
    commands = [line for line in completed.stdout.splitlines() if "-m scripts.gpu_check" in line]
    assert len(commands) == 1, completed.stdout
    return commands[0].split()[0], completed.stdout.splitlines()[0]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_gpu_check_uses_a_conda_env_only_when_it_is_the_projects():
    """An auto-activated base is not taken for the project's env (ImportError: torch): gpu-check names
    it and uses .venv; the active `taehv` env (by name or by path) is used; PY=... always wins."""
    python, first = _gpu_check_python("/opt/conda", "base")
    assert python == ".venv/bin/python"
    assert first.startswith("gpu-check: the active conda env /opt/conda is not the project's (taehv)"), first
    assert _gpu_check_python("/opt/conda/envs/taehv", "taehv")[0] == "/opt/conda/envs/taehv/bin/python"
    assert _gpu_check_python("/data/envs/taehv", "/data/envs/taehv")[0] == "/data/envs/taehv/bin/python"
    assert _gpu_check_python("", "")[0] == ".venv/bin/python"
    assert _gpu_check_python("/opt/conda", "base", "PY=/usr/bin/python3")[0] == "/usr/bin/python3"


NATIVE_LINUX_X86_64 = sys.platform == "linux" and platform.machine() == "x86_64"


def extras_options() -> list[str]:
    """pip options that resolve for CPython 3.11 on Linux x86_64 from wheels only, on any machine."""
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    options = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    return options + [option for name in platforms for option in ("--platform", name)]


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory):
    """The two pip resolutions of this module, started together (each mostly waits on the index, so
    two at once take the time of the longer): "environment", environment.yml's pip set resolved
    natively (read by test_the_gpu_environment_resolves_from_wheels_with_the_tested_torch; not
    started off Linux x86_64, where that test skips), and "extras", requirements-gpu-extras.txt for
    CPython 3.11 wheels (read by test_the_attention_extras_keep_the_tested_torch). Each is a future
    of dry_run's install list; its .result() raises what dry_run raised, in the test that reads it."""
    from concurrent.futures import ThreadPoolExecutor

    require_index()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {"extras": pool.submit(dry_run, tmp_path_factory.mktemp("extras"), [f"-r {EXTRAS.name}"], *extras_options())}
        if NATIVE_LINUX_X86_64:
            futures["environment"] = pool.submit(dry_run, tmp_path_factory.mktemp("environment"), environment_pip_lines())
        yield futures  # leaving the with-block waits for both, also where a test ran alone (-k)


@pytest.mark.slow
@pytest.mark.skipif(not NATIVE_LINUX_X86_64,
                    reason="resolves the Linux x86_64 wheels of the GPU machines natively (deepspeed, an sdist, "
                           "rules out pip's --platform/--python-version, which need --only-binary=:all:)")
def test_the_gpu_environment_resolves_from_wheels_with_the_tested_torch(resolutions):
    """Exactly the pip set environment.yml installs resolves in one pass (flash-attn's build, which
    imports torch, failed the whole pass), to the tested torch, a CUDA build whose libraries share one
    CUDA major that requirements-gpu.txt names, with every package a wheel but the pure-Python sdists."""
    packages = resolved(resolutions["environment"].result())
    where = f"(resolved for Python {platform.python_version()}; environment.yml has python=3.11)"
    version, file = packages["torch"]
    assert version == Version(the_tested_torch()), f"torch resolves to {version} ({file}), not {the_tested_torch()} {where}"
    majors = cuda_majors(packages)
    assert len(majors) == 1, f"torch {version} pulls CUDA libraries of majors {sorted(majors)} (or none) {where}"
    assert f"CUDA {majors.pop()}." in (ROOT / "requirements-gpu.txt").read_text(), \
        "requirements-gpu.txt does not name the CUDA major the pinned torch is built with"
    sdists = {name: file for name, (_, file) in packages.items() if not file.endswith(".whl")}
    assert set(sdists) <= set(PURE_PYTHON_SDISTS), (
        f"these would be built locally: {sorted(set(sdists) - set(PURE_PYTHON_SDISTS))} {where}")
    assert not set(packages) & ATTENTION_LIBRARIES


@pytest.mark.slow
def test_the_attention_extras_keep_the_tested_torch(resolutions):
    """xformers (requirements-gpu-extras.txt) resolves from wheels for CPython 3.11 on Linux x86_64
    without moving torch off the tested release."""
    packages = resolved(resolutions["extras"].result())
    assert packages["torch"][0] == Version(the_tested_torch()), packages["torch"]
    assert "xformers" in packages and "flash-attn" not in packages
    assert all(file.endswith(".whl") for _, file in packages.values())


# --- Into an existing PyTorch container, offline (issue 38 item 8) ---------------------------------
CONTAINER = ROOT / "requirements-container.txt"
# requirements.txt lines a container does not need: torch is the container's; these only check the code
NOT_IN_CONTAINER = {"torch", "pytest-xdist", "import-linter"}
# what a container with torch lacked on the H100 (../shared/reference/gpu-h100-2026-11.md), and the
# build backend an offline `pip install -e .` needs
CONTAINER_ADDITIONS = {"deepspeed", "diffusers", "av", "easydict", "hjson", "pydantic", "setuptools"}


def test_the_container_requirements_are_the_projects_without_torch():
    """requirements-container.txt holds requirements.txt's bounds, without torch (the container's)
    and without the tools that only check the code; the docs give the install that keeps torch."""
    def bounds(path: Path) -> dict[str, str]:
        return {canonicalize_name(req.name): str(req.specifier) for req, _ in requirements(path.read_text().splitlines(), ROOT)}

    project = {name: spec for name, spec in bounds(ROOT / "requirements.txt").items() if name not in NOT_IN_CONTAINER}
    assert bounds(CONTAINER) == project
    for doc in ("README.md", "docs/howto/container-offline.md"):
        text = (ROOT / doc).read_text()
        for command in ("make wheelhouse", "-c keep-torch.txt -r requirements-container.txt", "--no-index --find-links"):
            assert command in text, f"{doc} does not say `{command}`"


def _wheelhouse():
    import importlib

    return importlib.import_module("scripts.wheelhouse")


@pytest.mark.slow
def test_the_container_requirements_resolve_for_python_3_12_keeping_torch_2_11(tmp_path, monkeypatch):
    """The H100 container's case (CPython 3.12, torch 2.11.0, Linux x86_64), resolved by
    scripts/wheelhouse.py as `make wheelhouse` does, wheels only: pip keeps torch at 2.11.0 (a package
    wanting another torch fails this resolution), and the wheels to download are the six packages the
    container lacked and the rest, never torch or what only torch needs."""
    require_index()
    for key in list(os.environ):  # this machine's find-links, extra indexes and torch cap play no part
        if key.startswith("PIP_") and key not in PIP_REACH:
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    wheelhouse = _wheelhouse()
    lines = wheelhouse.top_level(CONTAINER)
    wheelhouse.build_pure_python(lines, tmp_path)
    options = wheelhouse.target_options("3.12", "manylinux_2_28_x86_64")
    install = wheelhouse.resolve(lines, "2.11.0", options, tmp_path)
    packages = resolved(install)
    assert packages["torch"][0] == Version("2.11.0"), packages["torch"]
    wanted, missing = wheelhouse.needed(install, lines, wheelhouse.marker_environment("3.12", "manylinux_2_28_x86_64"))
    assert not missing
    assert CONTAINER_ADDITIONS <= set(wanted), sorted(CONTAINER_ADDITIONS - set(wanted))
    assert not {name for name in wanted if name == "torch" or name == "triton" or name.startswith(("nvidia-", "cuda-"))}
    assert all(packages[name][1].endswith(".whl") for name in wanted)
    assert {path.name for path in tmp_path.glob("*.whl")} == {
        f"{name}-{packages[name][0]}-py3-none-any.whl" for name in ("deepspeed", "easydict")}


def _installed_torch(python: Path) -> dict:
    """The venv's torch as pip left it: version, and the identity of its RECORD and __init__.py (a
    reinstall, even of the same wheel, writes new files)."""
    code = ("import hashlib, importlib.metadata as m, json, os, torch; d = m.distribution('torch');"
            "files = [d.locate_file(f) for f in d.files if f.name == 'RECORD' or str(f) == 'torch/__init__.py'];"
            "print(json.dumps({'version': d.version, 'module': torch.__version__, 'files': {str(f): [os.stat(f).st_ino, "
            "os.stat(f).st_mtime_ns, hashlib.sha256(open(f, 'rb').read()).hexdigest()] for f in files}}))")
    completed = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, cwd=python.parent)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None or not NATIVE_LINUX_X86_64
                    or Version(platform.libc_ver()[1] or "0") < Version("2.28"),
                    reason="installs the manylinux_2_28 x86_64 wheels `make wheelhouse` writes, here")
def test_an_offline_install_from_the_wheelhouse_keeps_the_containers_torch(tmp_path):
    """A fresh venv holding torch (this interpreter's release, as a container holds its own), then
    docs/howto/container-offline.md's steps: `make wheelhouse` for this Python with that torch, and with no network
    (an unreachable proxy) `pip install --no-index --find-links` of requirements-container.txt with
    the torch constraint and `pip install -e .` of the project (its build backend from the
    wheelhouse). torch stays as it was, file for file; every package's dependencies are met; the
    project and the six packages the H100 container lacked import."""
    require_index()
    import torch

    venv, wheels, project = tmp_path / "venv", tmp_path / "wheelhouse", tmp_path / "project"
    python = venv / "bin" / "python"
    release = torch.__version__  # the container's torch: this interpreter's release, from where it came
    # `make wheelhouse` for this Python and torch, while the venv gets its torch (they are independent)
    with open(tmp_path / "wheelhouse.log", "w") as log:
        building = subprocess.Popen(["make", "wheelhouse", f"PY={sys.executable}", f"WHEELHOUSE={wheels}",
                                     f"PYTHON_VERSION={sys.version_info.major}.{sys.version_info.minor}",
                                     f"CONTAINER_TORCH={release}"],
                                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=pip_environment())
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # --no-compile here and below: byte-compiling is most of an install's time and plays no part here
    completed = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", f"torch=={release}"],
                               capture_output=True, text=True, timeout=900)
    if completed.returncode != 0 and "No matching distribution" in completed.stderr:
        building.kill()
        pytest.skip(f"torch=={release} cannot be installed into a fresh venv here: {completed.stderr.strip()[-300:]}")
    assert completed.returncode == 0, completed.stderr
    before = _installed_torch(python)
    assert building.wait(timeout=1200) == 0, (tmp_path / "wheelhouse.log").read_text()[-3000:]
    assert not [path.name for path in wheels.glob("torch-*")]

    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    for package in ("models", "training", "scripts"):
        shutil.copytree(ROOT / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))
    dead = "http://127.0.0.1:9"  # nothing listens: any download fails
    offline = {**pip_environment(), "PIP_PROXY": dead, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead,
               "http_proxy": dead, "https_proxy": dead, "NO_PROXY": "", "no_proxy": ""}
    keep = subprocess.run([str(python), "-c", 'import importlib.metadata as m; print("torch==" + m.version("torch"))'],
                          capture_output=True, text=True, check=True).stdout
    (tmp_path / "keep-torch.txt").write_text(keep)
    for arguments in (["-c", str(tmp_path / "keep-torch.txt"), "-r", str(CONTAINER)], ["--no-deps", "-e", str(project)]):
        completed = subprocess.run([str(python), "-m", "pip", "install", "--no-compile", "--no-index", "--find-links",
                                    str(wheels), *arguments], capture_output=True, text=True, env=offline, cwd=tmp_path,
                                   timeout=1200)
        assert completed.returncode == 0, f"{arguments}:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"

    assert _installed_torch(python) == before
    completed = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, env=offline, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    code = ("import av, deepspeed, diffusers, easydict, hjson, pydantic, torch, models, training.taehv_train;"
            "print(training.taehv_train.__file__)")
    completed = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1] == str(project / "training" / "taehv_train.py")


def test_every_requirement_has_the_lower_bound_make_lowest_deps_installs():
    """`make lowest-deps` installs each requirement at exactly its lower bound (scripts/lowest_deps.py checks
    the installed versions against them): every line of requirements.txt has one, and the check reads
    4.70.0 as 4.70 but not a later release (one the resolver had to take instead: the bound then says
    too little)."""
    from scripts.lowest_deps import MODULES, at_bound, lower_bounds

    names = {canonicalize_name(req.name) for req, _ in requirements((ROOT / "requirements.txt").read_text().splitlines(), ROOT)}
    bounds = lower_bounds()
    assert {canonicalize_name(name) for name in bounds} == names and set(MODULES) >= set(bounds)
    assert bounds["torch"] == "2.6"  # torch.nn.utils.get_total_norm
    assert at_bound("4.70.0", "4.70") and at_bound("2.6.0+cu124", "2.6") and at_bound("4.10.0.84", "4.10.0.84")
    assert not at_bound("3.8.4", "3.8") and not at_bound("4.8.0.76", "4.8") and not at_bound("2.13.0", "2.6")
    assert "lowest-deps:" in (ROOT / "Makefile").read_text() and "make lowest-deps" in (ROOT / "docs/howto/container-offline.md").read_text()
