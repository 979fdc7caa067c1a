"""`python -m training.plan ...`, the command's name before the layers: the same command as
`python -m training.plan ...` (training/plan/cli.py), kept for the scripts users already have.
runpy, not an import: the config layer does not depend on the plan layer above it."""

import runpy

runpy.run_module("training.plan", run_name="__main__", alter_sys=True)
