"""The state of one run: where it is (Progress, saved with every checkpoint) and everything the
loop touches (TrainingRun), built once by training/loop/train.py from named parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from training.base.failures import StopRequest
from training.base.seams import Seams
from training.base.run_log import RunLog
from training.config.schema import TrainConfig
from training.data.clips import FailureTracker
from training.loop.skips import STEP_SKIPS
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


@dataclass(kw_only=True)
class TrainingRun:
    """Everything the loop touches, built once by training/loop/train.py from named parts (keyword
    arguments only: parts of the same type cannot be swapped by position)."""

    # what the run trains with
    config: TrainConfig
    run_dir: Path
    accelerator: object
    model: object  # the prepared Student (a DeepSpeed engine under DeepSpeed)
    optimizer: object
    scheduler: object
    ema: WeightEMA | PartitionedEMA | None
    seraena: SeraenaState | None
    reference_vae: object  # None in autoencoder mode or with a latent cache
    lpips: object  # models.metrics.LPIPS, or None when its weights are not on this machine
    # where its clips come from
    loader: object
    sampler: object
    validation_dataset: object
    failures: FailureTracker
    # where it is and what it reports
    progress: Progress = field(default_factory=Progress)
    log: RunLog
    profiler: object = None
    last_metrics: dict = field(default_factory=dict)
    stop: StopRequest = field(default_factory=StopRequest)
    seams: Seams = field(default_factory=Seams)  # training/base/seams.py: fault injection installs hooks there
    # this rank's news for the next agreement, and the counts behind the run's decisions
    storage_down: str = ""  # this rank's loader gave up on object storage (training/base/storage.py)
    shared_memory_full: str = ""  # this rank's data worker ran out of /dev/shm (training/data/shared_memory.py)
    backward_oom_at: int = 0  # micro-step of an out-of-memory backward on this rank
    # the flags of this accumulation window's micro-steps that ran no collective (DDP's no_sync ones),
    # agreed at the window's end (training/loop/step.py WindowFault)
    window_faults: list = field(default_factory=list)
    last_reference_error: str = ""
    skipped_steps: dict = field(default_factory=lambda: {reason.name: 0 for reason in STEP_SKIPS})
    consecutive_bad_steps: int = 0
    failed_checkpoints: int = 0
    step_timeout_set: bool = False
    stopped_early: bool = False
    late_terms_warmed: bool = False  # cuDNN has met every term's shapes (training/step/losses.py warm_late_terms)
