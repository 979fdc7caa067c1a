"""The loader's batches for the loop: a dead data worker costs one batch, a full /dev/shm or lost
storage stops every rank together."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from training.config.views import at_largest_bucket
from training.data.shared_memory import SharedMemoryFull, shared_memory_stop
from training.base.storage import StorageUnavailable

if TYPE_CHECKING:
    from training.loop.state import TrainingRun


def loader_batches(run: TrainingRun):
    """The loader's batches from the sampler's position to the end of the epoch. A data worker that
    dies (a decoder segfault on one bad file among millions) costs one batch, not the rank: None
    comes in its place (train_step skips it on every rank, so micro-steps stay aligned), and a new
    loader iterator starts after it. Each death is counted as failed draws of the whole batch. A
    worker out of shared memory (SharedMemoryFull, or killed by SIGBUS) is no bad file: the rank
    sets run.shared_memory_full and every rank stops together (train_step)."""
    while True:
        if run.loader.num_workers > 0:
            # torch's SIGCHLD handler would raise the worker's death at whatever line the main
            # process is on (inside a collective, a backward); without it the next fetch raises it
            from torch.utils.data._utils import signal_handling

            signal_handling._SIGCHLD_handler_set = True
        iterator = None
        try:
            iterator = iter(run.loader)
            for batch in iterator:
                yield batch
            return
        except StorageUnavailable as error:  # past storage_retry_s: every rank stops together (train_step)
            # from a loader worker the message is torch's report, ending with "...StorageUnavailable: <ours>"
            run.storage_down = str(error).strip().splitlines()[-1].split("StorageUnavailable: ", 1)[-1]
            print(f"rank {run.accelerator.process_index}: {run.storage_down}", file=sys.stderr, flush=True)
        except SharedMemoryFull as error:  # the next batches would not fit either: every rank stops together (train_step)
            cause = str(error).strip().splitlines()[-1].split("SharedMemoryFull: ", 1)[-1]
            run.shared_memory_full = shared_memory_stop(at_largest_bucket(run.config), cause, local_processes())
        except RuntimeError as error:
            if "DataLoader worker" not in str(error):
                raise
            if killed_by_bus_error(iterator):  # not a bad file: a full /dev/shm ends a worker this way
                latent_shard = ", or reading a latent cache shard truncated on disk" if run.config.latent_cache else ""
                cause = f"a data worker was killed by SIGBUS (a bus error: how a process dies writing into a full /dev/shm{latent_shard})"
                run.shared_memory_full = shared_memory_stop(at_largest_bucket(run.config), cause, local_processes())
            else:
                print(f"rank {run.accelerator.process_index}: {error}; its batch is skipped", file=sys.stderr, flush=True)
                run.failures.update([("worker_died", str(error))] * run.config.batch_size_per_gpu, 0)
            run.loader._iterator = None  # persistent workers: the broken iterator must not be reused
        yield None
        # EpochShardSampler or, with aspect buckets, BucketBatchSampler: the same position in batches
        run.sampler.set_position(*divmod(run.progress.micro_step, run.sampler.batches_per_epoch))


def killed_by_bus_error(iterator) -> bool:
    """Whether a worker of this loader iterator died of SIGBUS (torch's own message then says only
    'exited unexpectedly', since loader_batches turns its SIGCHLD handler off)."""
    import signal

    return any(worker.exitcode == -signal.SIGBUS for worker in getattr(iterator, "_workers", []))


def local_processes() -> int | None:
    """Processes on this node (torchrun's LOCAL_WORLD_SIZE), None outside a launch."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None
