"""Puts a launched Python process under CUDA's dtype rules (tests/cuda_rules.py) from its start:
a test prepends this folder to PYTHONPATH and sets TAEHV_TEST_CUDA_RULES=<folder>; the process
writes the ops it checked to <folder>/<pid>.json at exit. A call that breaks a rule raises
inside the process, as CUDA would. For commands a test cannot wrap in-process (a script run as
`python -m`); training runs use tests/cuda_rules_probe.py, which wraps each micro-step only."""

import os

if os.environ.get("TAEHV_TEST_CUDA_RULES"):
    import atexit
    import json
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for cuda_rules
    from cuda_rules import CudaDtypeRules

    rules = CudaDtypeRules()
    rules.__enter__()

    def write_report() -> None:
        with open(os.path.join(os.environ["TAEHV_TEST_CUDA_RULES"], f"{os.getpid()}.json"), "w") as file:
            json.dump({"argv": sys.argv, "checked": rules.checked}, file)

    atexit.register(write_report)
