"""Check a machine before a run: prints a PASS/WARN/FAIL table, exits 1 on any FAIL.

    scripts/validate_setup.sh [NGPU PROFILE] [--set key=value ...]

Without NGPU PROFILE it checks the machine: the GPUs it has (NCCL and driver when CUDA sees
one), the video decoders, then the config, data and disk rows of the `cpu` profile.
Useful on a CPU machine too: GPU checks WARN there instead of failing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MIN_FREE_DISK_GB = 20


class Report:
    def __init__(self):
        self.rows: list[tuple[str, str, str]] = []

    def add(self, status: str, check: str, detail: str) -> None:
        self.rows.append((status, check, detail))

    def print(self) -> int:
        width = max(len(check) for _, check, _ in self.rows)
        for status, check, detail in self.rows:
            print(f"{status:4s}  {check:{width}s}  {detail}")
        failures = sum(status == "FAIL" for status, _, _ in self.rows)
        warnings = sum(status == "WARN" for status, _, _ in self.rows)
        print(f"\n{len(self.rows)} checks: {failures} FAIL, {warnings} WARN")
        return 1 if failures else 0


def requirement_bounds() -> list[tuple[str, str]]:
    """What training needs: requirements-container.txt's packages and torch's bound from
    requirements.txt, not the tools that only check the code (pytest-xdist, import-linter), which a
    GPU machine installed per docs/howto/container-offline.md does not have."""
    def bounds_of(name: str) -> list[tuple[str, str]]:
        found = []
        for line in (REPO_ROOT / name).read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9_.-]+)\s*>=\s*([\w.]+)", line.strip())
            if match:
                found.append((match.group(1), match.group(2)))
        return found

    return [bound for bound in bounds_of("requirements.txt") if bound[0] == "torch"] + bounds_of("requirements-container.txt")


def version_tuple(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def check_packages(report: Report) -> None:
    for name, lower in requirement_bounds():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            report.add("FAIL", f"package {name}", f"not installed (needs >= {lower}): make setup, or beside an installed torch "
                       "pip install -c keep-torch.txt -r requirements-container.txt (docs/howto/container-offline.md)")
            continue
        ok = version_tuple(installed) >= version_tuple(lower)
        report.add("PASS" if ok else "FAIL", f"package {name}", f"{installed} (needs >= {lower})")


def check_gpus(report: Report, ngpu: int | None, cpu_profile: bool) -> None:
    """ngpu None: no profile was named, so the machine's GPUs are reported without a count to meet."""
    import torch

    report.add("PASS", "torch", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")
    if cpu_profile:
        report.add("PASS", "GPUs", "CPU profile: no GPU needed")
        return
    if not torch.cuda.is_available():
        needs = "only the cpu and test profiles can run" if ngpu is None else f"this profile needs {ngpu}"
        report.add("WARN", "GPUs", f"no CUDA GPU visible; {needs}")
        return
    count = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    if ngpu is None:
        report.add("PASS", "GPUs", f"{count} visible ({', '.join(names)})")
    else:
        report.add("PASS" if count >= ngpu else "FAIL", "GPUs", f"{count} visible ({', '.join(names)}), {ngpu} needed")
    report.add("PASS", "NCCL", ".".join(map(str, torch.cuda.nccl.version())))
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.split()[0]
        report.add("PASS", "driver", driver)
    except (OSError, IndexError, subprocess.SubprocessError):
        report.add("WARN", "driver", "nvidia-smi not available")


def check_codecs(report: Report) -> None:
    """Can PyAV decode the codecs training clips come in? A wheel or FFmpeg build may lack some."""
    import av

    def readable(name: str) -> bool:
        try:
            av.codec.Codec(name, "r")
            return True
        except ValueError:  # av's UnknownCodecError
            return False

    missing = [label for label, name in (("H.264", "h264"), ("HEVC", "hevc")) if not readable(name)]
    notes = []
    if not any(readable(name) for name in ("libdav1d", "libaom-av1")):
        # FFmpeg's native av1 decoder works only with hardware acceleration, which decoding here does not use.
        missing.append("AV1")
        if readable("av1"):
            notes.append("only FFmpeg's native av1 decoder, which needs hardware acceleration")
    if not missing:
        report.add("PASS", "codecs", "PyAV decodes H.264, HEVC, AV1")
        return
    # Without H.264 almost no clip decodes; the others only matter for data stored in them.
    status = "FAIL" if "H.264" in missing else "WARN"
    report.add(status, "codecs", f"PyAV {av.__version__} cannot decode {', '.join(missing)}" + "".join(f" ({n})" for n in notes))


def check_config(report: Report, profile: str, ngpu: int, overrides: list[str]):
    from training.config.load import load_config
    from training.config.schema import ConfigError

    try:
        config = load_config(profile, overrides, num_processes=ngpu)
    except ConfigError as error:
        report.add("FAIL", "config", str(error))
        return None
    report.add("PASS", "config", f"{profile}: ZeRO {config.zero_stage}, global batch {config.global_batch_size}")
    return config


def check_data(report: Report, config) -> None:
    import random

    from training.base.storage import ObjectStore, StorageUnavailable, is_remote
    from training.data.decode import ClipError, read_clip
    from training.data.index import IndexFormatError, read_index

    root = config.data_root
    if is_remote(root):
        problem = ObjectStore(root, retry_s=0).problem()
        if problem:
            report.add("FAIL", "dataset", problem)
            return
    elif not Path(root).is_dir():
        status = "WARN" if config.sample_data else "FAIL"
        report.add(status, "dataset", f"{root} absent" + (f" ({config.sample_data} sample clips are made at start)" if config.sample_data else ""))
        return
    try:
        index = read_index(config.index_path or root, root, retry_s=config.storage_retry_s)
    except (IndexFormatError, StorageUnavailable) as error:
        report.add("FAIL", "dataset", str(error))
        return
    if len(index) < 2:
        from training.config.inputs import too_few_clips

        report.add("FAIL", "dataset", too_few_clips(root, len(index)))
        return
    for i in range(min(5, len(index))):
        try:
            with index.local_copy(i) as path:
                read_clip(path, int(index.frames[i]), 1, 1, 1, random.Random(0), loop_short=True)
            report.add("PASS", "dataset", f"{len(index)} clips in {config.index_path or root}; {index.relative(i)} decodes")
            return
        except ClipError as error:
            last = error
    report.add("FAIL", "dataset", f"none of the first 5 clips decodes: {last}")


def check_weights(report: Report, config) -> None:
    if config.pretrained_model_path:
        report.add("PASS", "pretrained", config.pretrained_model_path)
    else:
        report.add("PASS", "pretrained", "training from scratch")
    if not config.use_ref_vae:
        report.add("PASS", "reference VAE", "autoencoder mode: none needed")
    elif config.latent_cache:  # the loop then never loads it, so its path is not checked either
        report.add("PASS", "reference VAE", f"not loaded: latents come from the cache {config.latent_cache}")
    else:
        # the config check passed, so a path that is no local folder is a hub id found in the Hugging Face cache
        local = Path(config.ref_vae_path).exists()
        report.add("PASS", "reference VAE", config.ref_vae_path + ("" if local else " (hub id, in the Hugging Face cache)"))


def check_disk(report: Report, config) -> None:
    folder = Path(config.output_dir or "output")
    probe = folder if folder.exists() else next((p for p in folder.parents if p.exists()), Path("."))
    free_gb = shutil.disk_usage(probe).free / 2**30
    if not os.access(probe, os.W_OK):
        report.add("FAIL", "output folder", f"{probe} is not writable")
        return
    report.add("PASS" if free_gb >= MIN_FREE_DISK_GB else "WARN", "free disk", f"{free_gb:.0f} GB at {probe} (want >= {MIN_FREE_DISK_GB})")


def config_without_path_checks(profile: str, ngpu: int, overrides: list[str]):
    """The config when only its paths fail (the config row says which), else None."""
    from training.config.load import load_config
    from training.config.schema import ConfigError

    try:
        return load_config(profile, overrides, num_processes=ngpu, check_paths=False)
    except ConfigError:
        return None


def check_shared_memory(report: Report, config, processes_per_node: int) -> None:
    """/dev/shm against what the data loaders of this node's processes hold in it (training/data/shared_memory.py)."""
    from training.data.shared_memory import need_text, shared_memory_problem, shm_space, space_text

    if config.num_workers == 0:
        report.add("PASS", "shared memory", "num_workers=0: the data loader uses none")
        return
    problem = shared_memory_problem(config, processes_per_node)
    if problem:
        report.add("FAIL" if config.check_shared_memory else "WARN", "shared memory", problem)
        return
    report.add("PASS", "shared memory", f"the data loaders of this node need {need_text(config, processes_per_node)}; "
               f"{space_text(shm_space())}")


def check_network(report: Report) -> None:
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    machine_rank = os.environ.get("MACHINE_RANK", os.environ.get("RANK", "0"))
    if machine_rank == "0":
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
                report.add("PASS", "master port", f"{port} is free")
            except OSError:
                report.add("FAIL", "master port", f"{port} is busy: set MASTER_PORT")
    else:
        try:
            socket.getaddrinfo(address, port)
            report.add("PASS", "master address", f"{address} resolves")
        except OSError:
            report.add("FAIL", "master address", f"{address} does not resolve")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ngpu", nargs="?", type=int)
    parser.add_argument("profile", nargs="?")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.ngpu is not None and args.profile is None:
        parser.error("give NGPU and PROFILE together, or neither to check the machine")
    # No profile named: the GPU rows describe the machine; config, data and disk use the cpu profile.
    profile, ngpu = args.profile or "cpu", args.ngpu or 1
    report = Report()
    report.add("PASS" if sys.version_info >= (3, 10) else "FAIL", "python", sys.version.split()[0])
    check_packages(report)
    check_gpus(report, None if args.profile is None else ngpu, args.profile in ("cpu", "test"))
    check_codecs(report)
    config = check_config(report, profile, ngpu, args.overrides)
    if config is not None:
        check_data(report, config)
        check_weights(report, config)
        check_disk(report, config)
    # the machine's /dev/shm matters even while the inputs are missing (a cluster being prepared)
    config = config or config_without_path_checks(profile, ngpu, args.overrides)
    if config is not None:
        check_shared_memory(report, config, ngpu)
    check_network(report)
    return report.print()


if __name__ == "__main__":
    sys.exit(main())
