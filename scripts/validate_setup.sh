#!/usr/bin/env bash
# Check this machine for a run: scripts/validate_setup.sh [NGPU PROFILE] [--set key=value ...]
# Without NGPU PROFILE: the machine's GPUs, NCCL and codecs, with the cpu profile's config rows.
# Prints a PASS/WARN/FAIL table; exits non-zero on any FAIL.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" -m scripts.validate_setup "$@"
