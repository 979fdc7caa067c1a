"""Streaming: `StreamingTAEHV(model)` is upstream's API (`encode(x=None)` -> one latent or None,
`decode(x=None)` -> one frame or None, `flush_encoder()`, `flush_decoder()`, `flush()`, `reset()`);
`FrameStreamer` is this project's older list-returning API on single 4-D frames."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import torch
import torch.nn as nn

from models.taehv.model import TAEHV
from models.taehv.runners import SequentialRunner


_NEW_CHUNK = object()  # marker in the encoder's queue: the next frames start a chunk from empty memory


class _StreamPart:
    """The encoder or decoder side of a stream: queued inputs, and the lazily computed outputs of
    the input being processed, so each call does only the work its one result needs."""

    def __init__(self, model: nn.Sequential):
        self.model = model
        self.runner = SequentialRunner(model)
        self.queue: deque = deque()
        self.outputs: Iterator[torch.Tensor] = iter(())

    def next_output(self) -> torch.Tensor | None:
        while (output := next(self.outputs, None)) is None:
            if not self.queue:
                return None
            item = self.queue.popleft()
            if item is _NEW_CHUNK:
                self.runner = SequentialRunner(self.model)
            else:
                self.outputs = self.runner.outputs(item)
        return output


class StreamingTAEHV:
    """Upstream's streaming API: frames or latents go in as they arrive, one result comes out per
    call, with O(1) memory in T and only the decoder work the returned frame needs.

    Encode then decode (video to video):
        stream = StreamingTAEHV(model)
        for frame in frames:                        # frame: N,1,3,H,W in [0, 1] (any T works)
            latent = stream.encode(frame)           # N,1,L,h,w once t_downscale frames are in, else None
            decoded = stream.decode(latent)         # queues the latent (if any), returns the next frame or None
        remaining = stream.flush()                  # pads the encoder input, returns the last frames

    Decode only (e.g. a world model producing latents):
        frame = stream.decode(latent)               # N,1,3,H,W: the first frame of this latent
        while frame is not None:
            show(frame)
            frame = stream.decode()                 # the latent's other frames, one per call

    The results equal `encode_video` / `decode_video`, with these streaming limits: CogVideoX-rule
    models trim the leading frames only when `num_latent_frames` says the count is odd (upstream
    never trims them while streaming); chunked models (taeh3) drop the first frames of every chunk
    as decode_video does, but cannot drop or pad the end: for 5n+2 latents (the H3 rule) the frames
    are the same, for other counts the end differs. Call `reset()` before a new stream.
    """

    def __init__(self, taehv: "TAEHV", num_latent_frames: int | None = None):
        self.taehv = taehv
        self.trims_leading_frames = (
            taehv.args.trim_leading_frames and not taehv.args.cogvideox_trim_rule if num_latent_frames is None
            else taehv.trims_leading_frames(num_latent_frames)
        )
        self.reset()

    def reset(self) -> None:
        """Forget all state: the next frame or latent starts a new stream."""
        self._encoder = _StreamPart(self.taehv.encoder)
        self._decoder = _StreamPart(self.taehv.decoder)
        self._held_latents: deque = deque()  # chunked models: the clip's last latents get dropped
        self._last_frame: torch.Tensor | None = None
        self.n_frames_encoded = 0  # frames queued for the encoder, end padding included
        self.n_frames_decoded = 0  # decoder outputs, trimmed ones included

    @torch.no_grad()
    def encode(self, x: torch.Tensor | None = None) -> torch.Tensor | None:
        """Queue frames x (N,T,3,H,W in [0, 1], optional) and return the next latent (N,1,L,h,w), or
        None when more input is needed."""
        if x is not None:
            self.taehv._check_video(x)
            for frame in self.taehv._unshuffle(x).unbind(1):
                self._queue_frame(frame)
        chunk = self.taehv.args.chunk
        while (latent := self._encoder.next_output()) is not None:
            if chunk is None:
                return latent[:, None]
            self._held_latents.append(latent)  # released once it cannot be one of the clip's last
            if len(self._held_latents) > chunk.dropped_latents:
                return self._held_latents.popleft()[:, None]
        return None

    @torch.no_grad()
    def decode(self, x: torch.Tensor | None = None) -> torch.Tensor | None:
        """Queue latents x (N,T,L,h,w, optional) and return the next decoded frame (N,1,3,H,W in
        [0, 1]), or None when the queue is empty. Trimmed frames are never returned."""
        if x is not None:
            if x.ndim != 5 or x.shape[2] != self.taehv.latent_channels:
                raise ValueError(f"decode expects N,T,{self.taehv.latent_channels},h,w latents, got shape {tuple(x.shape)}")
            self._decoder.queue.extend(x.unbind(1))
        while (raw := self._decoder.next_output()) is not None:
            index = self.n_frames_decoded
            self.n_frames_decoded += 1
            if not self._is_trimmed(index):
                return self.taehv._finish_decoded(raw[:, None])
        return None

    def flush_encoder(self) -> list[torch.Tensor]:
        """End of input: pad with the last frame as encode_video does, return the remaining latents."""
        chunk = self.taehv.args.chunk
        if self._last_frame is not None:
            for _ in range(-self.n_frames_encoded % (chunk.frames if chunk else self.taehv.t_downscale)):
                self._queue_frame(self._last_frame)
        latents = []
        while (latent := self.encode()) is not None:
            latents.append(latent)
        self._held_latents.clear()  # chunked: dropped, as encode_video and the H3 VAE do
        return latents

    def flush_decoder(self) -> list[torch.Tensor]:
        """All frames of the latents queued so far."""
        frames = []
        while (frame := self.decode()) is not None:
            frames.append(frame)
        return frames

    def flush(self) -> list[torch.Tensor]:
        """End of a video-to-video stream: the remaining latents decoded, as a list of frames."""
        frames = [frame for latent in self.flush_encoder() if (frame := self.decode(latent)) is not None]
        return frames + self.flush_decoder()

    def _queue_frame(self, frame: torch.Tensor) -> None:
        args = self.taehv.args
        if args.chunk is not None and self.n_frames_encoded % args.chunk.frames == 0:
            self._encoder.queue.append(_NEW_CHUNK)
            self._encoder.queue.extend([torch.zeros_like(frame)] * args.chunk_lead_frames)
        self._encoder.queue.append(frame)
        self._last_frame = frame
        self.n_frames_encoded += 1

    def _is_trimmed(self, index: int) -> bool:
        args = self.taehv.args
        if args.chunk is not None:
            return index % args.chunk_decoded_frames < args.frames_to_trim
        return self.trims_leading_frames and index < args.frames_to_trim


class FrameStreamer:
    """This project's earlier streaming API (list-returning, single 4-D frames), on StreamingTAEHV.

    encode(frame N,3,H,W) -> list of latents (N,L,h,w) completed by this frame (0 or 1 items);
    flush() -> the last latent(s), padding pending frames with the last frame as encode_video does;
    decode(latent N,L,h,w) -> list of all decoded frames (N,3,H,W) it completes, trimmed as in
    decode_video. CogVideoX-rule models need `num_latent_frames` to know whether to trim.
    """

    def __init__(self, model: "TAEHV", num_latent_frames: int | None = None):
        if model.args.cogvideox_trim_rule and num_latent_frames is None:
            raise ValueError(
                f"variant {model.variant} trims decoded frames only for an odd latent count: "
                "pass num_latent_frames to FrameStreamer"
            )
        self.model = model
        self.stream = StreamingTAEHV(model, num_latent_frames)

    def encode(self, frame: torch.Tensor) -> list[torch.Tensor]:
        latents, latent = [], self.stream.encode(frame[:, None])
        while latent is not None:
            latents.append(latent[:, 0])
            latent = self.stream.encode()
        return latents

    def flush(self) -> list[torch.Tensor]:
        return [latent[:, 0] for latent in self.stream.flush_encoder()]

    def decode(self, latent: torch.Tensor) -> list[torch.Tensor]:
        frames, frame = [], self.stream.decode(latent[:, None])
        while frame is not None:
            frames.append(frame[:, 0])
            frame = self.stream.decode()
        return frames
