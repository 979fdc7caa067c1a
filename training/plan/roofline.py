"""The roofline floor of each part of a micro-step: max(FLOPs / peak, bytes / bandwidth), from the
FLOPs and bytes training/plan/step_flops.py counts on the meta device and a device's spec figures.

A floor is the time the part could not beat on that device even if every kernel ran at the spec
peak or the spec bandwidth; the bytes are an eager count (every op reads its inputs and writes its
outputs), so a compiler that fuses ops can go below the memory floor, never below the FLOP floor.
The parts run one after another, so the step's floor is the sum of theirs.

    python -m training.plan h100 --bytes     # the floors and each part's top ops by bytes
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s, no sparsity
    bandwidth: float  # memory bytes/s

    def label(self) -> str:
        return f"{self.name} ({self.peak_flops / 1e12:.0f} TFLOP/s dense bf16, {self.bandwidth / 1e12:.2f} TB/s)"


# from the vendors' spec sheets; the key is what torch.cuda.get_device_name contains, the more specific first
DEVICE_SPECS = {"H100 PCIe": DeviceSpec("H100 PCIe", 756e12, 2.0e12), "H100": DeviceSpec("H100 SXM", 989e12, 3.35e12),
                "H200": DeviceSpec("H200", 989e12, 4.8e12), "A800": DeviceSpec("A800", 312e12, 2.0e12),
                "A100": DeviceSpec("A100", 312e12, 2.0e12)}
H100 = DEVICE_SPECS["H100"]  # what the GPU profiles are planned for

PART_NAMES = {"student": "student", "lpips": "LPIPS", "seraena": "Seraena", "reference": "reference VAE encode",
              "optimizer": "optimizer", "total": "total"}


def spec_for(device_name: str) -> DeviceSpec | None:
    """The spec of a CUDA device by its name, None when the table has none."""
    return next((spec for key, spec in DEVICE_SPECS.items() if key in device_name), None)


def floor_s(flops: float, nbytes: float, spec: DeviceSpec) -> float:
    return max(flops / spec.peak_flops, nbytes / spec.bandwidth)


def floors(costs: dict[str, dict], spec: DeviceSpec = H100) -> dict[str, float]:
    """{part: floor in seconds} for step_costs' parts; "total" is the sum of the parts' floors."""
    parts = {part: floor_s(cost["flops"], cost["bytes"], spec) for part, cost in costs.items() if part != "total"}
    return {**parts, "total": sum(parts.values())}


def roofline_lines(config, costs: dict[str, dict] | None = None, spec: DeviceSpec = H100, top_ops: int = 0) -> list[str]:
    """The dry run's table: each part's FLOPs, bytes and floor, the step's floor and the clips/s it
    caps; with top_ops, each part's ops that move the most bytes."""
    from training.plan.step_flops import step_costs

    costs = costs or step_costs(config)
    floor = floors(costs, spec)
    lines = [f"{'part':<22}{'TFLOP':>8}{'GB':>9}{'floor ms':>10}  bound"]
    for part, cost in costs.items():
        bound = "memory" if cost["bytes"] / spec.bandwidth > cost["flops"] / spec.peak_flops else "compute"
        lines.append(f"{PART_NAMES.get(part, part):<22}{shown(cost['flops'] / 1e12):>8}{shown(cost['bytes'] / 1e9):>9}"
                     f"{shown(floor[part] * 1e3):>10}  {bound if part != 'total' else '(sum of the parts)'}")
    batch = config.batch_size_per_gpu
    summary = f"at most {batch / floor['total']:.1f} clips/s per GPU"
    if floor.get("reference"):
        summary += f" ({batch / (floor['total'] - floor['reference']):.1f} with latents cached)"
    lines.append(f"the floor: {floor['total'] * 1e3:.1f} ms per micro-step of {batch} clips, {summary}")
    for part, cost in costs.items() if top_ops else ():
        top = sorted(cost["ops"].items(), key=lambda item: -item[1])[:top_ops]
        lines.append(f"bytes by op, {PART_NAMES.get(part, part)}: "
                     + ", ".join(f"{op} {shown(moved / 1e9)} GB" for op, moved in top))
    return lines


def shown(value: float) -> str:
    """One decimal, or three significant digits below 1 (the optimizer's share is a few MB)."""
    return f"{value:.1f}" if value >= 0.95 or value == 0 else f"{value:.3g}"
