#!/usr/bin/env bash
# One node of a multi-node TAEHV job on a platform that runs this same script on every node
# (Kubernetes Indexed Job, Kubeflow PyTorchJob, Alibaba PAI-DLC, Volcano) with
#   WORLD_SIZE = number of nodes, RANK = this node's index, MASTER_ADDR, MASTER_PORT.
# Usage: start_multinode_platform.sh [options of train_taehv_h100.sh after the profile]
# Environment: GPUS_PER_NODE (default: detected), PROFILE (default: h100, picked by total GPUs),
#   CONFIG (a .py file: runs the custom profile), CONDA_ENV (activated when set).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "error: $*" >&2; exit 2; }

[[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0; }
for name in WORLD_SIZE RANK MASTER_ADDR; do
  [[ -n "${!name:-}" ]] || die "$name is not set: the platform must set WORLD_SIZE (nodes), RANK (node index), MASTER_ADDR, MASTER_PORT"
done
[[ "$WORLD_SIZE" =~ ^[1-9][0-9]*$ && "$RANK" =~ ^[0-9]+$ && "$RANK" -lt "$WORLD_SIZE" ]] \
  || die "WORLD_SIZE=$WORLD_SIZE and RANK=$RANK must be node count and node index (0 <= RANK < WORLD_SIZE)"

if [[ -n "${CONDA_ENV:-}" ]]; then
  command -v conda >/dev/null || die "CONDA_ENV=$CONDA_ENV but conda is not on PATH"
  eval "$(conda shell.bash hook)"
  conda activate "$CONDA_ENV"
  export PYTHON="${PYTHON:-python}"
fi

if [[ -z "${GPUS_PER_NODE:-}" ]]; then
  GPUS_PER_NODE="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
  [[ "$GPUS_PER_NODE" -gt 0 ]] || die "no GPU detected on this node: set GPUS_PER_NODE"
fi

# The platform's WORLD_SIZE/RANK count nodes; torch uses the same names for processes.
export NUM_MACHINES="$WORLD_SIZE" MACHINE_RANK="$RANK" MASTER_ADDR MASTER_PORT="${MASTER_PORT:-29500}"
unset WORLD_SIZE RANK

if [[ -n "${CONFIG:-}" ]]; then
  set -- custom "$CONFIG" "$@"
else
  set -- "${PROFILE:-h100}" "$@"
fi
echo "node $MACHINE_RANK of $NUM_MACHINES: $GPUS_PER_NODE GPU(s) per node, $((GPUS_PER_NODE * NUM_MACHINES)) processes in total"
exec "$REPO_ROOT/train_taehv_h100.sh" "$GPUS_PER_NODE" "$@"
