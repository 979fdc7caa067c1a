"""Shared memory (/dev/shm) for the data loader: what one node needs, what the machine has, and
the one line that says so before a launch (the launcher, the dry run, scripts/validate_setup.py)
or when a data worker runs out of it during a run (training/loop/recovery.py). No torch import: the
launcher's config step calls it.

Every batch a data worker makes reaches its rank through shared memory: the worker builds the
batch in a /dev/shm file (training/data/clips.py collate_clips) and passes its file descriptor; the
file lives until the rank drops the batch. Bytes one node needs, for num_workers > 0:

    processes per node x (num_workers x prefetch_factor + 2) x batch bytes

    batch bytes = batch_size_per_gpu x n_frames x 3 x height x width      (uint8 frames)
                  + with a latent cache, per clip: latent_frames x latent_channels
                    x ceil(height / s) x ceil(width / s) x 4              (fp32 latents, s the spatial factor)

num_workers x prefetch_factor is the loader's queue (torch asks for no more batches than that
ahead); the + 2 are the batch the loop trains on and the previous one, still referenced while the
next arrives. Measured on CPU with a consumer slower than its workers: 1, 2, 3 workers with
prefetch 1 to 4 peaked at num_workers x prefetch_factor + 1 batches (+ a few KB). Pinned copies
(GPU runs) are ordinary host memory, not /dev/shm; num_workers=0 decodes in the rank itself and
needs none. Not counted: NCCL's own shared-memory segments and anything else in /dev/shm; the
suggested --shm-size adds 25%. The h100 profile: 4 x 9 x 3 x 480 x 720 = 37.3 MB a batch,
8 x (8 x 2 + 2) batches = 5.4 GB a node; 16gpu_h100 (12 workers, prefetch 3): 11.3 GB a node.
"""

from __future__ import annotations

import math
import os
import sys

SHM_PATH = "/dev/shm"


IN_FLIGHT_EXTRA = 2  # the batch being trained on and the previous one (docstring)


MARGIN = 1.25  # the suggested --shm-size over the estimate: NCCL and other users of /dev/shm


class SharedMemoryFull(RuntimeError):
    """A data worker could not put its batch in shared memory (raised inside the worker, so the
    rank receives it with that batch instead of waiting for a batch that never comes)."""


def batch_bytes(config) -> int:
    """Bytes of one collated batch a worker passes to its rank."""
    clip = config.n_frames * 3 * config.height * config.width
    if config.latent_cache and config.use_ref_vae:
        from training.config.views import student_of

        args = student_of(config)  # the student's latent layout is the reference's
        side = args.spatial_downscale
        clip += (config.latent_frames * args.latent_channels * math.ceil(config.height / side)
                 * math.ceil(config.width / side) * 4)
    return config.batch_size_per_gpu * clip


def batches_in_flight(config) -> int:
    """Batches one rank's loader holds in shared memory at most (0 without workers)."""
    return config.num_workers * config.prefetch_factor + IN_FLIGHT_EXTRA if config.num_workers > 0 else 0


def loader_shared_memory_bytes(config, processes_per_node: int | None = None) -> int:
    """Shared memory the data loaders of one node need: processes per node (default: every process
    of the config on one node) x (num_workers x prefetch_factor + 2) x batch bytes."""
    processes = processes_per_node or max(1, config.num_processes)
    return processes * batches_in_flight(config) * batch_bytes(config)


def shm_space(path: str = SHM_PATH) -> tuple[int, int] | None:
    """(size, free bytes) of the shared-memory filesystem, None when it does not exist."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def size_text(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} bytes"


def shm_size_flag(need: int) -> str:
    """docker's --shm-size value for a need, with the margin, in whole GiB (docker's g)."""
    return f"--shm-size={max(1, math.ceil(need * MARGIN / 2**30))}g"


def need_text(config, processes_per_node: int | None = None) -> str:
    """'about 5.4 GB (8 processes x (8 workers x prefetch_factor 2 + 2) x 37.3 MB batches)'."""
    processes = processes_per_node or max(1, config.num_processes)
    need = loader_shared_memory_bytes(config, processes)
    return (f"about {size_text(need)} ({processes} process{'es' if processes > 1 else ''} x ({config.num_workers} "
            f"worker{'s' if config.num_workers > 1 else ''} x prefetch_factor {config.prefetch_factor} + "
            f"{IN_FLIGHT_EXTRA}) x {size_text(batch_bytes(config))} batches)")


def fix_text(config, processes_per_node: int | None = None) -> str:
    flag = shm_size_flag(loader_shared_memory_bytes(config, processes_per_node))
    return (f"make {SHM_PATH} larger (docker run {flag}; Kubernetes: an emptyDir: {{medium: Memory}} volume mounted at "
            f"{SHM_PATH}, see docs/howto/container-offline.md; a host: mount -o remount,size={flag.split('=')[1]} {SHM_PATH}) "
            "or lower num_workers, prefetch_factor or batch_size_per_gpu")


def space_text(space: tuple[int, int] | None, path: str = SHM_PATH) -> str:
    return f"{path} does not exist" if space is None else f"{path} is {size_text(space[0])} ({size_text(space[1])} free)"


def shared_memory_problem(config, processes_per_node: int | None = None, path: str = SHM_PATH) -> str:
    """'' when the node's loaders fit in the free shared memory (or use none), else one line with
    the sizes and the fix."""
    if config.num_workers == 0 or not sys.platform.startswith("linux"):
        return ""
    space = shm_space(path)
    if space is not None and space[1] >= loader_shared_memory_bytes(config, processes_per_node):
        return ""
    return (f"{space_text(space, path)} but the data loaders of this node need {need_text(config, processes_per_node)} "
            f"of shared memory: {fix_text(config, processes_per_node)}")


def shared_memory_line(config, processes_per_node: int | None = None, path: str = SHM_PATH) -> str:
    """The dry run's line: what the node's loaders need and whether this machine has it."""
    if config.num_workers == 0:
        return "shared memory per node: none (num_workers=0: each rank decodes its own batches)"
    space = shm_space(path)
    problem = shared_memory_problem(config, processes_per_node, path)
    verdict = (f"too small here, {fix_text(config, processes_per_node)}" if problem else "fits")
    where = "" if not sys.platform.startswith("linux") else f"; {space_text(space, path)}: {verdict}"
    return f"shared memory per node: {need_text(config, processes_per_node)} for the data loaders{where}"


def shared_memory_stop(config, cause: str, processes_per_node: int | None = None, path: str = SHM_PATH) -> str:
    """The line a run stops with when a data worker ran out of shared memory."""
    return (f"{cause}; {space_text(shm_space(path), path)} and the data loaders of this node need "
            f"{need_text(config, processes_per_node)}: {fix_text(config, processes_per_node)}")
