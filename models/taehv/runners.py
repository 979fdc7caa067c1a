"""Running a Sequential with memory blocks over time: all frames at once (`run_parallel`), or one
frame at a time with O(1) memory in the number of frames (`SequentialRunner`, `run_sequential`)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from models.taehv.blocks import MEMORY_BLOCKS, TGrow, TPool


def run_parallel(model: nn.Sequential, x: torch.Tensor, use_checkpointing: bool = False,
                 channels_last: bool = False) -> torch.Tensor:
    """All frames at once. x: N,T,C,H,W -> N,T',C',H',W'. With `channels_last`, activations stay
    NHWC between blocks (TPool and TGrow reshapes would otherwise hand on NCHW copies)."""
    n, t = x.shape[:2]
    x = x.reshape(n * t, *x.shape[2:])
    for block in model:
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)  # no copy when already NHWC
        if isinstance(block, MEMORY_BLOCKS):  # each frame sees the block's input at the frame before
            frames = x.shape[0] // n
            if use_checkpointing:
                x = checkpoint(block, x, None, frames, use_reentrant=False)
            else:
                x = block(x, frames=frames)
        elif use_checkpointing and any(p.requires_grad for p in block.parameters()):
            x = checkpoint(block, x, use_reentrant=False)
        else:
            x = block(x)
    return x.reshape(n, -1, *x.shape[1:])


class SequentialRunner:
    """Feeds frames one at a time through a Sequential; memory is O(1) in the number of frames.

    Each memory block keeps its previous input, each TPool buffers frames until it has `stride`,
    each TGrow emits `stride` frames; frames leave in temporal order.
    """

    def __init__(self, model: nn.Sequential):
        self.model = model
        self.past: dict[int, torch.Tensor] = {}
        self.pool_buffers: dict[int, list[torch.Tensor]] = {}

    def push(self, frame: torch.Tensor) -> list[torch.Tensor]:
        """frame: N,C,H,W -> list of output frames (N,C',H',W'), possibly empty."""
        return list(self.outputs(frame))

    def outputs(self, frame: torch.Tensor) -> Iterator[torch.Tensor]:
        """Like `push`, but lazy: each output frame is computed when it is asked for, so a stream can
        show the first frame of a TGrow before computing the next. Exhaust it before the next call."""
        return self._walk(0, frame)

    def _walk(self, start: int, x: torch.Tensor) -> Iterator[torch.Tensor]:
        for index in range(start, len(self.model)):
            block = self.model[index]
            if isinstance(block, MEMORY_BLOCKS):
                past = self.past.get(index)
                self.past[index] = x
                x = block(x, torch.zeros_like(x) if past is None else past)
            elif isinstance(block, TPool):
                buffer = self.pool_buffers.setdefault(index, [])
                buffer.append(x)
                if len(buffer) < block.stride:
                    return
                del self.pool_buffers[index]
                x = block.conv(torch.cat(buffer, 1))
            elif isinstance(block, TGrow):
                grown = block.conv(x).unflatten(1, (block.stride, x.shape[1]))
                for step in range(block.stride):
                    yield from self._walk(index + 1, grown[:, step])
                return
            else:
                x = block(x)
        yield x


def run_sequential(model: nn.Sequential, x: torch.Tensor, show_progress_bar: bool = False) -> torch.Tensor:
    """Frame by frame; gives the same result as `run_parallel` to float rounding."""
    runner = SequentialRunner(model)
    frames = range(x.shape[1])
    if show_progress_bar:
        from tqdm.auto import tqdm

        frames = tqdm(frames, unit="frame")
    outputs = [y for t in frames for y in runner.outputs(x[:, t])]
    return torch.stack(outputs, 1)


def pad_with_last_frame(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """N,T,... -> N,T',... with T' the next multiple of `multiple`, repeating the last frame."""
    missing = -x.shape[1] % multiple
    return torch.cat([x, x[:, -1:].expand(-1, missing, *x.shape[2:])], 1) if missing else x
