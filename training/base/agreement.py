"""Cross-rank agreement: the one place where ranks decide together what a step does.

Rule (docs/architecture.md): no collective runs inside the student's forward. Each rank finds
out on its own whether its micro-step went wrong (out of memory, a non-finite loss, a reference
VAE failure, too many broken clips, a checkpoint it could not write, a stop signal), then all
ranks exchange those flags in one small all-reduce, and every rank takes the same decision:
skip, stop, or go on to the collectives of the step (Seraena's discriminator update, the
gradient all-reduce, the optimizer). A fault on one rank therefore costs a skipped step, never a
collective mismatch or a hang, and the log names the ranks it happened on.
"""

from __future__ import annotations

import torch


class Agreed(dict):
    """flag name -> ranks (sorted) on which it was raised; only raised flags are present."""

    def any(self, *names: str) -> bool:
        return any(name in self for name in names)

    def where(self, name: str) -> str:
        ranks = self.get(name, [])
        return f"on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}" if ranks else ""


def agree(accelerator, **flags: "bool | torch.Tensor") -> Agreed:
    """Every rank passes the same flag names; returns, on every rank, which ranks raised which.
    One all-reduce of a (processes x flags) table: each rank fills its own row. A flag is a Python
    bool or a 0-dim tensor on the device (a non-finite check, say): it is copied into the table on
    the device, so the table's one read below is the step's only wait for the GPU."""
    names = list(flags)
    table = torch.zeros(accelerator.num_processes, len(names), device=accelerator.device)
    row = table[accelerator.process_index]
    for i, name in enumerate(names):
        flag = flags[name]
        if isinstance(flag, torch.Tensor):
            row[i] = flag.to(row.dtype)  # device to device: no wait
        elif flag:
            row[i] = 1.0
    if accelerator.num_processes > 1:
        table = accelerator.reduce(table, reduction="sum")
    raised = table.tolist()  # the one read of the device per micro-step
    return Agreed({name: [r for r, counts in enumerate(raised) if counts[i] > 0] for i, name in enumerate(names)
                   if any(counts[i] > 0 for counts in raised)})
