"""Write a wheelhouse: every wheel the project needs beyond torch, for a target Python and Linux
platform, so that a machine without internet installs the project into the torch it already has
(`make wheelhouse`; docs/howto/container-offline.md).

  python -m scripts.wheelhouse --out DIR --python-version 3.12 [--torch 2.11.0] [--platform manylinux_2_28_x86_64]

1. Builds the wheels of the packages PyPI has only as sdists (deepspeed, easydict: pure Python,
   so one py3-none-any wheel serves every target), here, once.
2. Resolves requirements-container.txt and the build backend of pyproject.toml (an offline
   `pip install -e .` needs setuptools) for the target, from wheels only, with torch held at the
   container's release: a package that needs another torch fails the resolution here, not later
   in the container.
3. Downloads every resolved wheel the project reaches without going through torch: torch, its
   CUDA libraries and triton are the container's.

Needs the Python that runs it, with pip 24.2 or newer (pip 24.0 checks a wheel's Requires-Python
against the Python that runs it, not --python-version, and picks older releases), and internet.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare Python: pip carries both
    from pip._vendor import tomli as tomllib
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO_ROOT / "requirements-container.txt"
# PyPI has no wheel of these; they build without a compiler or torch (deepspeed's CUDA ops compile
# at first use), so the wheel built here is py3-none-any
BUILT_HERE = ("deepspeed", "easydict")
# the container's: never downloaded, nor what only they need
CONTAINER_HAS = ("torch",)
OLDEST_PIP = "24.2"


def platforms(newest: str) -> list[str]:
    """The manylinux tags a machine with `newest` (manylinux_2_N_ARCH) also runs, newest first:
    pip takes --platform literally, so the older glibc tags and their legacy names are listed."""
    found = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", newest)
    if not found:
        raise SystemExit(f"--platform {newest}: expected manylinux_2_N_ARCH, e.g. manylinux_2_28_x86_64 "
                         "(glibc 2.28 or newer; `ldd --version` in the container says which)")
    glibc, arch = int(found.group(1)), found.group(2)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for minor, name in legacy.items() if minor <= glibc]


def target_options(python_version: str, platform: str) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    options = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi]
    return options + [option for tag in platforms(platform) for option in ("--platform", tag)]


def marker_environment(python_version: str, platform: str) -> dict[str, str]:
    """The target's values of the environment markers (pip evaluates markers with the Python that
    runs it, whatever --python-version says)."""
    arch = platform.split("_", 3)[-1]
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": f"{python_version}.0", "os_name": "posix", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": arch}


def run_pip(*arguments: str) -> None:
    completed = subprocess.run([sys.executable, "-m", "pip", *arguments], capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"pip {' '.join(arguments[:3])} ... failed:\n{completed.stdout[-3000:]}{completed.stderr[-3000:]}")


def top_level(requirements: Path) -> list[str]:
    """The requirement lines of the file and of pyproject's build backend, and `wheel` (older
    setuptools ask for it to build an editable install)."""
    lines = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    backend = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    return [line for line in lines if line] + list(backend) + ["wheel"]


def build_pure_python(lines: list[str], out: Path) -> None:
    """Step 1: wheels of the BUILT_HERE packages, newest release the lines allow."""
    wanted = [line for line in lines if canonicalize_name(Requirement(line).name) in BUILT_HERE]
    run_pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), *wanted)
    for wheel in out.glob("*.whl"):
        if canonicalize_name(wheel.name.split("-")[0]) in BUILT_HERE and not wheel.name.endswith("-py3-none-any.whl"):
            raise SystemExit(f"{wheel.name} is not a pure-Python wheel: it would run only on this machine")


def resolve(lines: list[str], torch: str, options: list[str], find_links: Path) -> list[dict]:
    """pip's install list for the lines on the target (nothing installed), torch held at `torch`."""
    with tempfile.TemporaryDirectory() as scratch:
        requirement_file, constraint, report, target = (Path(scratch) / name for name in ("req.txt", "keep.txt", "report.json", "target"))
        requirement_file.write_text("\n".join(lines) + "\n")
        constraint.write_text(f"torch=={torch}\n")
        # --target: older pip takes platform options with --dry-run only there (nothing is written)
        run_pip("install", "--dry-run", "--target", str(target), "--quiet", "--report", str(report), *options,
                "--find-links", str(find_links), "-c", str(constraint), "-r", str(requirement_file))
        return json.loads(report.read_text())["install"]


def needed(install: list[dict], lines: list[str], environment: dict[str, str]) -> tuple[dict[str, dict], set[str]]:
    """({name: report item} the project reaches without going through CONTAINER_HAS, with the
    target's markers; the names it reaches that the report lacks: pip left them out by its own
    markers, and the caller resolves again with them named)."""
    items = {canonicalize_name(item["metadata"]["name"]): item for item in install}
    reached, missing, seen = {}, set(), set()
    stack = [(canonicalize_name(r.name), frozenset(r.extras)) for r in map(Requirement, lines)]
    while stack:
        name, extras = stack.pop()
        if name in CONTAINER_HAS or (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name not in items:
            missing.add(name)
            continue
        reached[name] = items[name]
        for text in items[name]["metadata"].get("requires_dist", []):
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({**environment, "extra": extra}) for extra in extras | {""}):
                stack.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return reached, missing


def plan(lines: list[str], torch: str, python_version: str, platform: str, find_links: Path) -> dict[str, dict]:
    """Steps 2 and 3's list: {name: report item} of every wheel to have."""
    options, environment = target_options(python_version, platform), marker_environment(python_version, platform)
    for _ in range(5):
        install = resolve(lines, torch, options, find_links)
        reached, missing = needed(install, lines, environment)
        if not missing:
            return reached
        lines = lines + sorted(missing)  # the target needs them: named, pip resolves them whatever its markers say
    raise SystemExit(f"the resolution keeps leaving out {sorted(missing)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the wheelhouse folder (created)")
    parser.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                        help="the container's Python, e.g. 3.12 (default: this one)")
    parser.add_argument("--torch", default="2.11.0",
                        help="the container's torch release, e.g. 2.11.0 (a local part such as +cu130 or an NGC "
                             "2.11.0a0+git... is read as its release); default 2.11.0, the one that ran on an H100")
    parser.add_argument("--platform", default="manylinux_2_28_x86_64",
                        help="the newest manylinux tag the container runs (its glibc and CPU); older ones are added")
    parser.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    args = parser.parse_args(argv)
    found = re.fullmatch(r"(3\.\d+)(\.\d+)?", args.python_version)  # 3.12.7: Docker's python images set PYTHON_VERSION so
    if not found:
        raise SystemExit(f"--python-version {args.python_version}: expected 3.N, e.g. 3.12")
    args.python_version = found.group(1)
    import pip

    if Version(pip.__version__) < Version(OLDEST_PIP):
        raise SystemExit(f"pip {pip.__version__} of {sys.executable} resolves for this Python, not for --python-version: "
                         f"pip {OLDEST_PIP} or newer is needed (`{sys.executable} -m pip install -U pip`, or run `make setup` "
                         "first: make wheelhouse then uses .venv)")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?\S*", args.torch):
        raise SystemExit(f"--torch {args.torch}: expected the container's torch release, e.g. 2.11.0 "
                         "(python -c 'import torch; print(torch.__version__)' there)")
    torch = Version(args.torch).base_version
    args.out.mkdir(parents=True, exist_ok=True)
    lines = top_level(args.requirements)

    build_pure_python(lines, args.out)
    wheels = plan(lines, torch, args.python_version, args.platform, args.out)
    fetch = [f"{name}=={item['metadata']['version']}" for name, item in sorted(wheels.items()) if name not in BUILT_HERE]
    run_pip("download", "--no-deps", "--quiet", "--dest", str(args.out), *target_options(args.python_version, args.platform),
            "--find-links", str(args.out), *fetch)
    print(f"{args.out}: {len(wheels)} wheels for CPython {args.python_version} on {args.platform} and older, "
          f"resolved with torch {torch} kept (not included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
