"""Build DeepSpeed's C++ op for CPU runs (deepspeed_shm_comm) once, where a later DeepSpeed run on
this machine would build it at its start: about 2 CPU-minutes, then cached in torch's extension folder
(TORCH_EXTENSIONS_DIR, else <XDG cache>/torch_extensions). `make test` runs it before the suite, so
the first DeepSpeed test does not pay the build inside its own time. Nothing to do, and said so,
without DeepSpeed or without a C++ compiler (CPU runs then use DDP). The suite hides GPUs from its
runs, so on a GPU machine too this builds the CPU accelerator's op.

    python -m scripts.build_deepspeed_cpu_op
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time


def main() -> int:
    if importlib.util.find_spec("deepspeed") is None:
        print("DeepSpeed CPU op: deepspeed is not installed, nothing to build")
        return 0
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        print(f"DeepSpeed CPU op: no C++ compiler ({compiler}), nothing to build (CPU runs use ddp_cpu.yaml)")
        return 0
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU accelerator's op, as the suite's CPU runs use it
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not builder.is_compatible():
        print("DeepSpeed CPU op: not available on this platform, nothing to build")
        return 0
    start = time.monotonic()
    builder.load(verbose=False)
    print(f"DeepSpeed CPU op: {builder.absolute_name()} ready ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
