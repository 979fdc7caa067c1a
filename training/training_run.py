"""The state of one training run: everything the loop, checkpoints, faults, validation and the run
log touch, built once by training/taehv_train.py's main() (they import this room, not the entry point)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from training.checkpoints import Progress
from training.config import TrainConfig
from training.dataset import FailureTracker
from training.distill import PartitionedEMA, SeraenaState, WeightEMA
from training.faults import FaultInjection, StopRequest
from training.run_log import RunLog


@dataclass
class TrainingRun:
    """Everything the loop touches, built once by main()."""

    config: TrainConfig
    run_dir: Path
    accelerator: object
    log: RunLog
    model: object  # the prepared Student (a DeepSpeed engine under DeepSpeed)
    optimizer: object
    scheduler: object
    loader: object
    sampler: object
    validation_dataset: object
    reference_vae: object
    seraena: SeraenaState | None
    ema: WeightEMA | PartitionedEMA | None
    lpips: object  # models.metrics.LPIPS, or None when its weights are not on this machine
    failures: FailureTracker
    progress: Progress
    profiler: object = None
    last_metrics: dict = field(default_factory=dict)
    stop: StopRequest = field(default_factory=StopRequest)
    faults: FaultInjection = field(default_factory=FaultInjection.from_environment)
    skipped_steps: dict = field(default_factory=lambda: {"nonfinite": 0, "oom": 0, "reference": 0, "worker": 0})
    last_reference_error: str = ""
    consecutive_bad_steps: int = 0
    storage_down: str = ""  # this rank's loader gave up on object storage (training/storage.py), not yet agreed
    shared_memory_full: str = ""  # this rank's data worker ran out of /dev/shm (training/shared_memory.py), not yet agreed
    backward_oom_at: int = 0  # micro-step of an out-of-memory backward on this rank, not yet agreed
    step_timeout_set: bool = False
    failed_checkpoints: int = 0
    stopped_early: bool = False
