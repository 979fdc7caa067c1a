"""The state of one run: where it is (Progress, saved with every checkpoint) and everything the
loop touches (TrainingRun), built once by training/loop/train.py from named parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from training.base.failures import StopRequest
from training.base.fault_injection import FaultInjection
from training.base.run_log import RunLog
from training.config.schema import TrainConfig
from training.data.clips import FailureTracker
from training.step.ema import PartitionedEMA, WeightEMA
from training.step.seraena import SeraenaState


class Progress:
    """Where the run is, saved with every checkpoint (registered with accelerate): optimizer
    steps, batches drawn (they differ by accumulation and by skipped batches, and the data
    position follows the batches), and the early-stopping record."""

    def __init__(self):
        self.step = 0
        self.micro_step = 0
        self.best_value: float | None = None
        self.best_step = 0
        self.validations_without_improvement = 0
        self.baseline: dict | None = None  # validation metrics of pretrained_model_path, scored once

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.micro_step = int(state.get("micro_step", self.step))
        self.best_value = state.get("best_value")
        self.best_step = int(state.get("best_step", 0))
        self.validations_without_improvement = int(state.get("validations_without_improvement", 0))
        self.baseline = state.get("baseline")


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
    storage_down: str = ""  # this rank's loader gave up on object storage (training/base/storage.py), not yet agreed
    shared_memory_full: str = ""  # this rank's data worker ran out of /dev/shm (training/data/shared_memory.py), not yet agreed
    backward_oom_at: int = 0  # micro-step of an out-of-memory backward on this rank, not yet agreed
    step_timeout_set: bool = False
    failed_checkpoints: int = 0
    stopped_early: bool = False
