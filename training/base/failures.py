"""What an exception means (out of memory, a peer gone, a collective timeout), the collective timeout
itself, stop requests, ranks that die with their launcher."""

from __future__ import annotations

from datetime import timedelta

import torch


class StopRequest:
    """SIGTERM / SIGINT (preemption): finish the current step, checkpoint, exit STOPPED_BY_SIGNAL (training/base/launch.py)."""

    def __init__(self):
        self.requested = False
        self.agreed = False

    def install(self) -> "StopRequest":
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True


# RuntimeErrors that mean the device ran out of memory: cuDNN and cuBLAS report a failed allocation
# as their own status, not as torch.OutOfMemoryError
MEMORY_ERRORS = ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED", "CUDA error: out of memory")


def is_memory_error(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and any(marker in str(error) for marker in MEMORY_ERRORS))


def is_peer_gone(error: BaseException) -> bool:
    """A collective that broke because another rank left (it stopped with its own message, or died):
    gloo's transport messages, and NCCL's as torch's DistBackendError carries them (the remote-error
    code, or an internal error whose last error is the socket the peer closed)."""
    text = str(error)
    return isinstance(error, RuntimeError) and any(marker in text for marker in (
        "Connection closed by peer", "Connection closed by remote peer", "Connection reset by peer", "Broken pipe",
        "NCCL communicator was aborted", "remote process exited", "remote process exiting prematurely", "ncclRemoteError"))


def die_with_launcher() -> None:
    """A rank whose agent dies (SIGKILL, the OOM killer) would otherwise train on as an orphan
    beside the restarted job, writing into the same run folder: Linux SIGKILLs it when its parent
    goes. training/taehv_train.py asks first, before torch loads (a rank whose agent went while it
    started ends there); this asks again for a main() started some other way. The last checkpoint
    is the resume point either way."""
    from training.base.launch import die_with_agent

    die_with_agent()


def set_collective_timeout(seconds: float) -> int:
    """The timeout of every process group this rank belongs to: the default one and those DeepSpeed
    made for its gradient reduce-scatter and parameter gathers (created with torch's own default,
    10 minutes on NCCL). Returns how many groups got it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0
    c10d = dist.distributed_c10d
    groups = [group for group in c10d._world.pg_map if not c10d._rank_not_in_group(group)]
    for group in groups:
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)
    return len(groups)


def is_collective_timeout(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)
