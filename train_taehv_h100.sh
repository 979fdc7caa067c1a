#!/usr/bin/env bash
# Train TAEHV on one machine (or one node, when start_multinode_platform.sh calls it).
# Run with --help for usage.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$REPO_ROOT"

usage() {
  cat <<'EOF'
Usage: train_taehv_h100.sh NGPU PROFILE [CONFIG_PATH] [options]

  NGPU      processes on this machine (GPUs, or CPU processes for cpu/test where torch sees no CUDA device)
  PROFILE   1gpu_h100 | h100 (any total of 2 or more: picks h100, 16gpu_h100 or 64gpu_h100 from NGPU x nodes,
            keeping the global batch by accumulation) | a800 | cpu | test
            | custom CONFIG_PATH (a .py file with `overrides = dict(...)`)

Options:
  --resume PATH|latest|auto
                         continue from a checkpoint folder, or the newest complete one of the run
                         (latest: error when there is none; auto: start fresh when there is none)
  --output-dir DIR       the run folder (default output/<timestamp>, with output/latest -> it)
  --max-steps N          stop after N optimizer steps
  --recipe NAME          a published training recipe on top of the profile: seraena-notebook, vidtok,
                         opensora2, no-gan (docs/training.md#recipe-presets); --set overrides it
  --set KEY=VALUE        override any config key (repeatable); see docs/configuration.md
  --debug                verbose logs, NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL
  --profile              write a torch.profiler trace of a few steps into <run>/profile/
  --dry-run              print the resolved config, files, process counts, environment and
                         the exact accelerate command, then exit without training
  -h, --help             this text

Environment (defaults in brackets): PYTHON [.venv/bin/python if present, else python3],
MASTER_ADDR [127.0.0.1; required with NUM_MACHINES > 1], MASTER_PORT [29500], NUM_MACHINES [1], MACHINE_RANK [0];
every NCCL_*/CUDA/allocator variable set below keeps the caller's value when already set.
EOF
}

if [[ -t 1 ]]; then RED=$'\e[31m'; GREEN=$'\e[32m'; BOLD=$'\e[1m'; RESET=$'\e[0m'; else RED=""; GREEN=""; BOLD=""; RESET=""; fi
die() { echo "${RED}error:${RESET} $*" >&2; exit 2; }
# A dry run starts nothing: machine problems are listed in its plan as warnings, errors otherwise.
MACHINE_WARNINGS=()
machine_problem() { if (( DRY_RUN )); then MACHINE_WARNINGS+=("$*"); else die "$*"; fi; }

# ---------------------------------------------------------------- arguments
[[ $# -ge 1 && ( "$1" == "-h" || "$1" == "--help" ) ]] && { usage; exit 0; }
[[ $# -ge 2 ]] || { usage >&2; exit 2; }
NGPU="$1"; PROFILE="$2"; shift 2
[[ "$NGPU" =~ ^[1-9][0-9]*$ ]] || die "NGPU must be a positive integer, got '$NGPU'"
CONFIG_PATH=""
if [[ "$PROFILE" == "custom" ]]; then
  [[ $# -ge 1 && "$1" != --* ]] || die "custom needs a config file: train_taehv_h100.sh $NGPU custom training/configs/my_run.py"
  CONFIG_PATH="$1"; shift
  [[ -f "$CONFIG_PATH" ]] || die "config file not found: $CONFIG_PATH"
fi

USER_OPTIONS=("$@")  # repeated in a staged run's "continue" line: the stages not started yet need them too
RESUME=""; OUTPUT_DIR=""; MAX_STEPS=""; DEBUG=0; TORCH_PROFILE=0; DRY_RUN=0; SETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --resume) [[ $# -ge 2 ]] || die "--resume needs PATH or latest"; RESUME="$2"; shift 2 ;;
    --output-dir) [[ $# -ge 2 ]] || die "--output-dir needs a folder"; OUTPUT_DIR="$2"; shift 2 ;;
    --max-steps) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || die "--max-steps needs a positive integer"; MAX_STEPS="$2"; shift 2 ;;
    --set) [[ $# -ge 2 && "$2" == *=* ]] || die "--set needs KEY=VALUE"; SETS+=("$2"); shift 2 ;;
    --recipe) [[ $# -ge 2 && -n "$2" ]] || die "--recipe needs a NAME (docs/training.md#recipe-presets)"; SETS=("recipe=$2" "${SETS[@]+"${SETS[@]}"}"); shift 2 ;;
    --debug) DEBUG=1; shift ;;
    --profile) TORCH_PROFILE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

NUM_MACHINES="${NUM_MACHINES:-1}"
MACHINE_RANK="${MACHINE_RANK:-0}"
[[ "$NUM_MACHINES" =~ ^[1-9][0-9]*$ ]] || die "NUM_MACHINES='$NUM_MACHINES' must be a positive integer (machines in the job)"
# several machines meet at machine 0's address: the loopback default would leave them waiting until the timeout
(( NUM_MACHINES == 1 )) || [[ -n "${MASTER_ADDR:-}" ]] || die "NUM_MACHINES=$NUM_MACHINES needs MASTER_ADDR: set it to the address of machine 0 (MACHINE_RANK=0) that every machine can reach, the same on each"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
TOTAL_PROCESSES=$((NGPU * NUM_MACHINES))
# what a printed continue line starts with, so that it runs as printed on this machine (each machine prints its own)
NODE_VARIABLES=""
(( NUM_MACHINES > 1 )) && NODE_VARIABLES="NUM_MACHINES=$NUM_MACHINES MACHINE_RANK=$MACHINE_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# ---------------------------------------------------------------- profile -> config module
case "$PROFILE" in
  h100)
    # the module written for the nearest count at or below the total; on a count it was not written
    # for, it keeps its global batch by accumulation and says so (training/config/load.py fit_process_count)
    if (( TOTAL_PROCESSES == 1 )); then die "profile h100 is for 2 or more GPUs, got 1: use 1gpu_h100 (one 80 GB GPU, H100 or A800 alike)"
    elif (( TOTAL_PROCESSES < 16 )); then CONFIG="h100"
    elif (( TOTAL_PROCESSES < 64 )); then CONFIG="16gpu_h100"
    else CONFIG="64gpu_h100"; fi ;;
  1gpu_h100|a800|cpu|test|16gpu_h100|64gpu_h100) CONFIG="$PROFILE" ;;
  custom) CONFIG="$CONFIG_PATH" ;;
  *) die "unknown profile '$PROFILE': use 1gpu_h100, h100, a800, cpu, test or custom CONFIG_PATH" ;;
esac
[[ -n "$MAX_STEPS" ]] && SETS+=("max_steps=$MAX_STEPS")
SET_ARGS=(); for item in "${SETS[@]+"${SETS[@]}"}"; do SET_ARGS+=(--set "$item"); done

# ---------------------------------------------------------------- resolve and validate (no training yet)
# A dry run checks the inputs (weights, reference VAE, data, LPIPS) after the plan and lists them all.
# The run folder (--output-dir; else the config's output_dir; else the run being resumed; else a new
# output/<timestamp>) and, when resuming a recorded run, that run's own settings (training/run/folder.py).
SHELL_ARGS=(); (( DRY_RUN )) && SHELL_ARGS=(--no-check-paths)
[[ "$MACHINE_RANK" == "0" ]] && SHELL_ARGS+=(--refuse-busy-run-folder)  # another training holds the run folder
RUN_ARGS=(--num-processes "$TOTAL_PROCESSES" --processes-per-node "$NGPU" --output-dir "$OUTPUT_DIR" --resume "$RESUME" "${SET_ARGS[@]+"${SET_ARGS[@]}"}")
RESOLVED="$("$PYTHON" -m training.plan "$CONFIG" "${RUN_ARGS[@]}" "${SHELL_ARGS[@]+"${SHELL_ARGS[@]}"}" --shell)" || exit 2
eval "$RESOLVED"
OUTPUT_DIR="$RUN_DIR"
# A CPU accelerate file (*_cpu.yaml: the cpu and test profiles) is a CPU run wherever it runs: on a
# GPU machine its processes get no GPU (CUDA_VISIBLE_DEVICES="" below), so make test gives the same
# results there as on a laptop. The cpu and test profiles with another file (test with
# deepspeed_1gpu.yaml, as make gpu-check launches it) are a GPU run where torch sees a CUDA device
# (GPU environment, NGPU against the visible GPUs, the memory budget, no C++ compiler for
# DeepSpeed's CPU op) and a CPU run where it sees none; a GPU profile on a machine without CUDA
# stays a GPU plan, refused for want of GPUs.
CPU_FILE=0; [[ "$(basename "$ACCELERATE_CONFIG_FILE")" == *_cpu.yaml ]] && CPU_FILE=1
CPU_MEANT=$CPU_FILE; [[ "$PROFILE" == "cpu" || "$PROFILE" == "test" ]] && CPU_MEANT=1
CPU_RUN=0; (( CPU_FILE || (CPU_MEANT && VISIBLE_GPUS == 0) )) && CPU_RUN=1
[[ -f "$ACCELERATE_CONFIG_FILE" ]] || die "accelerate file not found: $ACCELERATE_CONFIG_FILE"

# Collectives time out later on bigger jobs: at least 30 minutes per node.
if (( NUM_MACHINES > 1 && CONFIG_NCCL_TIMEOUT_S < 1800 * NUM_MACHINES )); then
  SETS+=("nccl_timeout_s=$((1800 * NUM_MACHINES))"); SET_ARGS+=(--set "nccl_timeout_s=$((1800 * NUM_MACHINES))")
fi

# ------------------------------------------------------------- staged runs (docs/howto/finetune.md#stages)
# A config with stages=(...) runs each stage as its own launch of this script, in
# <run>/stage<K>-<name>/, from the previous stage's export; a stage that finished is skipped and
# an interrupted one resumes, so the same command continues a staged run wherever it stopped.
STAGE_GIVEN=0
for item in "${SETS[@]+"${SETS[@]}"}"; do [[ "$item" == stage=* ]] && STAGE_GIVEN=1; done
run_stages() {
  local k=0 previous="" entry name stage_dir status
  mkdir -p "$OUTPUT_DIR"
  for entry in $CONFIG_STAGES; do
    k=$((k + 1)); name="${entry%%:*}"; stage_dir="$OUTPUT_DIR/stage$k-$name"
    if [[ -f "$stage_dir/FINISHED" ]]; then
      echo "stage $k ($name): finished earlier ($stage_dir/final)"; previous="$stage_dir"; continue
    fi
    local args=("$NGPU" "$PROFILE"); [[ -n "$CONFIG_PATH" ]] && args+=("$CONFIG_PATH")
    args+=(--output-dir "$stage_dir" --resume auto "${SET_ARGS[@]+"${SET_ARGS[@]}"}" --set "stage=$k")
    [[ -n "$previous" ]] && args+=(--set "pretrained_model_path=$previous/final")  # the export folder: its <variant>.pth
    (( DEBUG )) && args+=(--debug)
    echo "${BOLD}stage $k ($name, ${entry##*:} steps)${RESET}: $stage_dir"
    "$0" "${args[@]}" &
    STAGE_CHILD=$!
    trap 'kill -TERM "$STAGE_CHILD" 2>/dev/null || true' TERM INT HUP  # the stage checkpoints and stops
    while :; do
      status=0; wait "$STAGE_CHILD" || status=$?
      kill -0 "$STAGE_CHILD" 2>/dev/null || break
    done
    trap - TERM INT HUP
    if [[ ! -f "$stage_dir/FINISHED" && -f "$stage_dir/STOPPED_CLEANLY" ]]; then  # stopped by a signal: exit 143 too
      local again=("$0" "$NGPU" "$PROFILE" ${CONFIG_PATH:+"$CONFIG_PATH"} "${USER_OPTIONS[@]+"${USER_OPTIONS[@]}"}")
      [[ " ${USER_OPTIONS[*]+"${USER_OPTIONS[*]}"} " == *" --output-dir "* ]] || again+=(--output-dir "$OUTPUT_DIR")
      echo "stopped in stage $k ($name); continue the staged run with:${NODE_VARIABLES:+ ${NODE_VARIABLES% }}$(printf ' %q' "${again[@]}")"
      return 143
    fi
    (( status == 0 )) || return "$status"
    previous="$stage_dir"
  done
  ln -sfn "$(basename "$previous")/final" "$OUTPUT_DIR/final"
  echo "all $k stages done: $OUTPUT_DIR/final -> $previous/final"
}
if [[ -n "$CONFIG_STAGES" ]] && (( ! STAGE_GIVEN && ! DRY_RUN )); then
  run_stages; exit $?
fi

# GPU memory: an estimate per rank (training/plan/memory.py) against gpu_memory_gb, before any GPU is touched.
MEMORY_ARGS=("$CONFIG" "${RUN_ARGS[@]}" --quiet --no-check-paths --memory)
(( CPU_RUN )) || MEMORY_ARGS+=(--check-gpu-budget)
if (( ! DRY_RUN && ! CPU_RUN )); then
  "$PYTHON" -m training.plan "${MEMORY_ARGS[@]}" >/dev/null || exit 2
fi

# ---------------------------------------------------------------- machine checks
if (( CPU_RUN )); then
  GPU_IDS="none (a CPU run: torch sees no CUDA device)"
  (( CPU_FILE && VISIBLE_GPUS > 0 )) && GPU_IDS="none (a CPU run: $(basename "$ACCELERATE_CONFIG_FILE") hides this machine's $VISIBLE_GPUS GPU(s) from it)"
else
  (( VISIBLE_GPUS >= NGPU )) || machine_problem "asked for $NGPU GPUs but $VISIBLE_GPUS are visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}); lower NGPU or free GPUs"
  GPU_IDS="${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((NGPU - 1)))}"
fi
# /dev/shm: the data workers of the NGPU processes pass their batches through it (training/data/shared_memory.py);
# too small, the first batch that does not fit would stop the run. check_shared_memory=false: a warning only.
if [[ -n "$SHM_PROBLEM" ]]; then
  if (( CONFIG_CHECK_SHM )); then machine_problem "$SHM_PROBLEM"
  else echo "warning: $SHM_PROBLEM (check_shared_memory=false: launching anyway)" >&2; fi
fi
# DeepSpeed without a GPU builds its shared-memory op (deepspeed_shm_comm) with a C++ compiler on
# first use; say so now rather than after a page of ninja output.
if (( CPU_RUN && CONFIG_ZERO_STAGE > 0 )) && ! command -v "${CXX:-c++}" >/dev/null; then
  machine_problem "accelerate_config=$(basename "$ACCELERATE_CONFIG_FILE") runs DeepSpeed on CPU, which compiles a C++ op at start, but no C++ compiler (${CXX:-c++}) was found: use the default ddp_cpu.yaml, or install g++ and ninja"
fi
if [[ "$MACHINE_RANK" == "0" ]]; then
  "$PYTHON" - "$MASTER_PORT" <<'PY' || machine_problem "master port $MASTER_PORT is busy: set MASTER_PORT to a free port"
import socket, sys
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", int(sys.argv[1])))
    except OSError:
        sys.exit(1)  # the launcher says it in one line
PY
fi

# ---------------------------------------------------------------- environment (caller's values win)
ENV_NAMES=()
setenv() { local name="$1" value="$2"; if [[ -z "${!name+x}" ]]; then export "$name=$value"; fi; ENV_NAMES+=("$name"); }
if (( CPU_RUN )); then
  setenv OMP_NUM_THREADS "$(( $(nproc) / NGPU > 0 ? $(nproc) / NGPU : 1 ))"
  if (( CPU_FILE )); then export CUDA_VISIBLE_DEVICES=""; ENV_NAMES+=(CUDA_VISIBLE_DEVICES); fi  # not the caller's: no GPU
else
  setenv OMP_NUM_THREADS 8
  # fewer fragmentation OOMs when clip shapes or the validation batch differ from training's
  setenv PYTORCH_CUDA_ALLOC_CONF "expandable_segments:True"
  # a timed-out NCCL collective (step_timeout_s) tears the process down instead of hanging it
  setenv TORCH_NCCL_ASYNC_ERROR_HANDLING 1
  # NCCL's own defaults otherwise: no buffer size, IB timeout, P2P or cross-NIC setting was measured here
fi
if (( DEBUG )); then
  setenv NCCL_DEBUG INFO
  setenv TORCH_DISTRIBUTED_DEBUG DETAIL
  setenv TAEHV_LOG_LEVEL DEBUG
fi

# ---------------------------------------------------------------- the command
# training/base/launch.py is accelerate launch that passes the training's one-line errors and exit codes on
LAUNCH=("$PYTHON" -m training.base.launch
  --config_file "$ACCELERATE_CONFIG_FILE"
  --num_processes "$TOTAL_PROCESSES" --num_machines "$NUM_MACHINES" --machine_rank "$MACHINE_RANK"
  --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT")
(( NUM_MACHINES > 1 )) && LAUNCH+=(--deepspeed_multinode_launcher standard)
LAUNCH+=(training/taehv_train.py --config "$CONFIG" --output-dir "$OUTPUT_DIR" "${SET_ARGS[@]+"${SET_ARGS[@]}"}")
[[ -n "$RESUME" ]] && LAUNCH+=(--resume "$RESUME")
(( TORCH_PROFILE )) && LAUNCH+=(--torch-profile)

cat <<EOF
${BOLD}TAEHV training${RESET}
  profile          $PROFILE -> $CONFIG_SOURCE
  accelerate file  $ACCELERATE_CONFIG_FILE (ZeRO $CONFIG_ZERO_STAGE, $CONFIG_MIXED_PRECISION)
  processes        $NGPU per machine x $NUM_MACHINES machine(s) = $TOTAL_PROCESSES (this is machine $MACHINE_RANK)
  GPUs             $GPU_IDS
  global batch     $CONFIG_GLOBAL_BATCH clips = $CONFIG_BATCH_PER_GPU per process x $TOTAL_PROCESSES processes x $CONFIG_ACCUMULATION accumulation steps
  clip             $CONFIG_CLIP
  steps            $CONFIG_MAX_STEPS
  master           $MASTER_ADDR:$MASTER_PORT
  run folder       $OUTPUT_DIR
  resume           ${RESUME:-no}
  data / weights   $CONFIG_DATA_ROOT | ${CONFIG_PRETRAINED:-from scratch} | $CONFIG_REF_VAE
  model            $CONFIG_MODEL
EOF
if [[ -n "$CONFIG_STAGES" ]] && (( ! STAGE_GIVEN )); then
  echo "  stages           $CONFIG_STAGES (name:steps; each a launch with --set stage=K in $OUTPUT_DIR/stage<K>-<name>/)"
fi

if (( DRY_RUN )); then
  echo "environment:"
  for name in "${ENV_NAMES[@]+"${ENV_NAMES[@]}"}"; do echo "  $name=${!name}"; done
  echo "command:"
  printf ' %q' "${LAUNCH[@]}"; echo
  echo "machine:"
  for warning in "${MACHINE_WARNINGS[@]+"${MACHINE_WARNINGS[@]}"}"; do echo "  warning: $warning"; done
  (( ${#MACHINE_WARNINGS[@]} )) || echo "  ok"
  # resolved config, memory estimate and every input problem, in one process (one torch import)
  REPORT_ARGS=("$CONFIG" "${RUN_ARGS[@]}" --quiet --dry-run-report)
  (( CPU_RUN )) || REPORT_ARGS+=(--check-gpu-budget)
  REPORT_STATUS=0; "$PYTHON" -m training.plan "${REPORT_ARGS[@]}" 2>&1 || REPORT_STATUS=$?
  case "$REPORT_STATUS" in
    0) echo "${GREEN}dry run: nothing started${RESET}"; exit 0 ;;
    1) echo "${RED}dry run: inputs are missing (listed above, each with its fix); nothing started${RESET}" ;;
    3) echo "${RED}dry run: the estimated GPU memory exceeds gpu_memory_gb (above, with the fix); nothing started${RESET}" ;;
    *) echo "${RED}dry run: the report failed (above); nothing started${RESET}" ;;
  esac
  exit 1
fi

# Preemption or Ctrl-C (SIGTERM/SIGINT/SIGHUP): the ranks finish the step, write a checkpoint and
# leave <run>/STOPPED_CLEANLY. The agent (torchrun) runs in its own process group, so a Ctrl-C
# reaches only this script, which passes SIGTERM to the ranks (the agent's children): the agent
# then sees its workers exit 0 and ends quietly instead of printing a traceback.
rm -f "$OUTPUT_DIR/STOPPED_CLEANLY" "$OUTPUT_DIR/FINISHED"
TAEHV_LAUNCHER_PID=$$ "$PYTHON" -c 'import os, sys; os.setpgid(0, 0); os.execvp(sys.argv[1], sys.argv[1:])' "${LAUNCH[@]}" &
CHILD=$!
stop_training() {
  SIGNALLED=1; SIGNALLED_EVER=1
  pkill -TERM -P "$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null || true
}
SIGNALLED_EVER=0
trap stop_training TERM INT HUP
# A trapped signal makes `wait` return 128+signal at once, even when the child has just finished
# on its own (a preemption racing the end of the run): wait again for the child's own status.
while :; do
  SIGNALLED=0; STATUS=0
  wait "$CHILD" || STATUS=$?
  (( SIGNALLED && STATUS > 128 )) || break
done
RESUME_COMMAND="$NODE_VARIABLES$0 $NGPU $PROFILE${CONFIG_PATH:+ $CONFIG_PATH} --output-dir $OUTPUT_DIR --resume latest"
# A stop by a signal exits 143 (128 + SIGTERM) after its checkpoint, never 0: a job scheduler reads 0 as
# done and would never restart a preempted run (docs/howto/train-multinode.md).
if [[ -f "$OUTPUT_DIR/STOPPED_CLEANLY" ]]; then
  echo "stopped cleanly: checkpoint $OUTPUT_DIR/checkpoints/$(cat "$OUTPUT_DIR/STOPPED_CLEANLY"); continue with: $RESUME_COMMAND"
  exit 143
fi
# A stop that came after the run had exported its final weights (the agent was tearing down): done.
if (( STATUS != 0 && SIGNALLED_EVER )) && [[ -f "$OUTPUT_DIR/FINISHED" ]]; then
  echo "finished before the stop request: $OUTPUT_DIR/final"
  exit 0
fi
# A run that failed after a checkpoint (a rank out of memory, a lost node): the way back, once fixed.
if (( STATUS != 0 )) && compgen -G "$OUTPUT_DIR/checkpoints/checkpoint-*" > /dev/null; then
  echo "the run stopped (exit $STATUS); once the cause above is fixed, continue with: $RESUME_COMMAND" >&2
fi
exit "$STATUS"
