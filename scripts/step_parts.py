"""Where a micro-step's time goes (`python -m scripts.benchmark --profile P --kernels`): each part
of the step timed where the step marks it, and the top kernels by time.

The step (scripts/benchmark.py profile_step) marks its parts with `with parts("backward"):` and
`parts.watch(module, name)` (a module's forward, wherever it is called). StepParts, the default,
does nothing; TimedParts times each part by CUDA events on a GPU (nothing waits for the GPU inside
the step) and by perf_counter on a CPU, each part without the parts inside it (LPIPS inside the
losses). top_kernels runs the step under torch.profiler: kernels by CUDA time on a GPU, aten ops
by self CPU time on a CPU. parts_markdown() is the table: each part beside its roofline floor
(training/plan/roofline.py, counted by training/plan/step_flops.py), then the kernels.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

# in the step's order; what each covers
PARTS = {"reference_encode": "reference VAE encode", "student_forward": "student forward (encode, decodes)",
         "losses": "losses (the terms, LPIPS aside)", "lpips": "LPIPS forward", "seraena": "Seraena (critic, its update)",
         "backward": "backward", "optimizer": "optimizer step"}


class StepParts:
    """The marks a step makes, doing nothing: the step timed whole."""

    def __call__(self, name: str):
        return contextlib.nullcontext()

    def watch(self, module: torch.nn.Module | None, name: str) -> None:
        pass


class TimedParts(StepParts):
    """Each marked part's seconds per window (collect() after the window, once the device is synchronized)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.open: list[list] = []  # [name, start, [closed parts inside it]]
        self.closed: list[tuple] = []  # (name, start, end, parts inside it)
        self.windows: list[dict[str, float]] = []

    def stamp(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self, name: str) -> None:
        self.open.append([name, self.stamp(), []])

    def end(self) -> None:
        name, start, inside = self.open.pop()
        (self.open[-1][2] if self.open else self.closed).append((name, start, self.stamp(), inside))

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.begin(name)
        try:
            yield
        finally:
            self.end()

    def watch(self, module: torch.nn.Module | None, name: str) -> None:
        if module is not None:
            module.register_forward_pre_hook(lambda *_: self.begin(name))
            module.register_forward_hook(lambda *_: self.end())

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def collect(self) -> None:
        totals: dict[str, float] = {}

        def add(parts):
            for name, start, end, inside in parts:
                own = self.seconds(start, end) - sum(self.seconds(s, e) for _, s, e, _ in inside)
                totals[name] = totals.get(name, 0.0) + own
                add(inside)

        add(self.closed)
        self.closed = []
        self.windows.append(totals)

    def medians(self, warmup: int, per: int) -> dict[str, float]:
        """{part: median seconds per micro-step} over the windows after `warmup`, a window being `per` micro-steps."""
        kept = self.windows[warmup:]
        return {name: statistics.median(w.get(name, 0.0) for w in kept) / per for name in PARTS if any(name in w for w in kept)}


def top_kernels(step, device: torch.device, micro_steps: int, count: int = 15) -> list[dict]:
    """The `count` kernels (aten ops on a CPU) that took the most time in one run of step(), which
    runs `micro_steps` micro-steps: name, calls in that run, milliseconds per micro-step, share of the total."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as profiler:
        step()
        if cuda:
            torch.cuda.synchronize(device)
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)  # microseconds
    events = [e for e in profiler.key_averages() if own(e) > 0]
    total = sum(own(e) for e in events)
    return [{"name": e.key, "calls": e.count,
             "ms_per_micro_step": own(e) / 1e3 / micro_steps, "share": own(e) / total}
            for e in sorted(events, key=own, reverse=True)[:count]]


def part_rows(result: dict) -> list[tuple[str, float, float | None]]:
    """(label, seconds per micro-step, roofline floor or None): each part, what lies outside the
    parts, the step, and the student with LPIPS (forward, losses and backward: the backward is one
    pass through both) against their floors together."""
    parts, floor = result["parts_s"], result["predicted_floor_s"]
    own_floor = {"reference_encode": "reference", "seraena": "seraena", "optimizer": "optimizer"}
    rows = [(PARTS[name], seconds, floor.get(own_floor.get(name))) for name, seconds in parts.items()]
    rows.append(("outside the parts (Python between them)", result["step_s"] - sum(parts.values()), None))
    rows.append(("**step**", result["step_s"], floor["total"]))
    together = ("student_forward", "losses", "lpips", "backward")
    rows.append(("student and LPIPS: forward, losses, backward", sum(parts.get(n, 0.0) for n in together),
                 floor["student"] + floor.get("lpips", 0.0)))
    return rows


def parts_markdown(result: dict) -> str:
    step = result["step_s"]
    lines = [f"Micro-step of the {result['profile']} profile on {result['device']} ({result['parts_timer']}); floors on "
             f"{result['floor_device']}; `{result['command']}`", "",
             "| part | ms per micro-step | share of the step | roofline floor ms | over the floor |", "|---|---:|---:|---:|---:|"]
    for label, seconds, floor in part_rows(result):
        over = f"{seconds / floor:.1f}x" if floor else ""
        lines.append(f"| {label} | {seconds * 1e3:.2f} | {seconds / step:.1%} | {'' if floor is None else f'{floor * 1e3:.3g}'} | {over} |")
    lines += ["", f"Top kernels by {result['kernel_timer']}, one window of the step:", "",
              "| kernel | calls in the window | ms per micro-step | share |", "|---|---:|---:|---:|"]
    for kernel in result["top_kernels"]:
        name = kernel["name"].replace("|", "/")
        lines.append(f"| `{name[:120]}` | {kernel['calls']} | {kernel['ms_per_micro_step']:.2f} | {kernel['share']:.1%} |")
    return "\n".join(lines) + "\n"
