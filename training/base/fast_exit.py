"""Ending a command that imported torch without the interpreter's teardown.

After a script returns, CPython waits for its non-daemon threads, runs the atexit handlers (logging's
flush, multiprocessing's children, open writers), flushes stdout and stderr, and then frees every
module's objects one by one. With torch, dynamo and DeepSpeed loaded, that last part is 1-2 s of
CPU in which nothing is written (measured on 2 cores: `import torch` then exit, 2.7 s; the same
with os._exit, 1.9 s; a training rank, 2.1 s after its last atexit handler). Every rank of every
launch, the launcher's agent and each inference or plan command paid it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_now(code: int | None) -> None:
    """Exits with `code` (None: 0) as the interpreter would, less the freeing of its objects. The two
    calls below are CPython's own first exit steps (private names, present in 3.10-3.13)."""
    threading._shutdown()  # its exit hooks (a pool's manager thread), then it waits for non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code or 0)
