"""Why a micro-step can be skipped on every rank: one record per reason, with its agreement flag,
its counter (train/skipped_<name>_steps), the words of its log line and its advice. A new reason
is one record here plus the flag its rank raises (training/loop/step.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SkipReason:
    name: str  # the agreement's flag and the counter's key
    what: str  # "<what> on rank R at micro-step M ..."
    kind: str  # "N <kind> steps in a row"
    advice: str  # printed when too many in a row stop the run


CHECK_DATA = "check the data (python -m training.data.preview ...)"

# in the order the step checks them: a lost batch explains whatever else its rank reports
STEP_SKIPS = (
    SkipReason("worker", "a data worker died (its batch lost)", "lost-batch",
               f"A decoder crashed on a file (its rank's error output has the signal); {CHECK_DATA} and remove the "
               "file from the index"),
    SkipReason("oom", "out of memory", "out-of-memory",
               "Lower batch_size_per_gpu (raise gradient_accumulation_steps to keep the global batch), n_frames or "
               "height/width, or set gradient_checkpointing=true"),
    SkipReason("reference", "non-finite reference latents", "reference-VAE-failure",
               "Check the reference VAE weights and precision (ref_vae_path), or the clips of those batches"),
    SkipReason("nonfinite", "non-finite loss", "non-finite",
               f"Lower learning_rate, {CHECK_DATA} or resume from an earlier checkpoint"),
)
SKIPS = {reason.name: reason for reason in STEP_SKIPS}
# inside a DDP accumulation window these reach the rank's gradients before anyone knows (the loss
# goes backward unread): the window's end drops its gradients so far on every rank
# (training/loop/step.py report_window); a failed forward has no backward and spoils nothing
WINDOW_POISONING = ("reference", "nonfinite")
