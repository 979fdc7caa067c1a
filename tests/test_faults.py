"""Fault handling pieces that need no launch: which errors count as out of memory, which mean a
peer left, and the collective timeout reaching every process group (DeepSpeed makes its own)."""

import torch
import torch.distributed as dist

from scripts.benchmark import free_port
from training.base.failures import is_memory_error, is_peer_gone, set_collective_timeout


def test_memory_errors_include_cudnn_and_cublas_allocation_failures_only():
    assert is_memory_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_memory_error(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert is_memory_error(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not is_memory_error(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"))  # a real bug: it must surface
    assert not is_memory_error(ValueError("CUDNN_STATUS_ALLOC_FAILED"))


def test_peer_gone_is_told_apart_from_other_failures():
    assert is_peer_gone(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"))
    assert is_peer_gone(RuntimeError("NCCL error: remote process exited or there was a network error"))
    # NCCL as torch raises it (DistBackendError is a RuntimeError): a peer's socket closed under an internal error
    assert is_peer_gone(RuntimeError("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, internal error, "
                                     "NCCL version 2.21.5\nncclInternalError: Internal check failed.\nLast error:\n"
                                     "Net : Connection closed by remote peer node7<43236>"))
    assert is_peer_gone(RuntimeError("ncclRemoteError: A call failed possibly due to a network error or a remote process "
                                     "exiting prematurely."))
    assert not is_peer_gone(RuntimeError("Timed out waiting 600000ms for recv operation to complete"))


def test_the_collective_timeout_reaches_every_process_group(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        own = dist.new_group([0])  # as DeepSpeed makes its data-parallel groups: torch's default timeout
        assert set_collective_timeout(42) == 2
        for group in (dist.group.WORLD, own):
            assert group._get_backend(torch.device("cpu")).options._timeout.total_seconds() == 42
    finally:
        dist.destroy_process_group()


def test_an_nccl_watchdog_abort_is_explained_with_the_runs_timeouts(tmp_path):
    """On NCCL the watchdog aborts a rank (SIGABRT) before the training can print its line: the
    launcher's line says which timeouts applied, read from the run folder."""
    from training.base.launch import watchdog_reason

    (tmp_path / "resolved_config.json").write_text('{"step_timeout_s": 60, "nccl_timeout_s": 1800}')
    assert "step_timeout_s=60 after the first step, nccl_timeout_s=1800 until then" in watchdog_reason(tmp_path)
    assert "step_timeout_s after the first step" in watchdog_reason(None)  # a launch that wrote no run folder
