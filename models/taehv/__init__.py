"""TAEHV: Tiny AutoEncoder for video diffusion latents, compatible with the public weight files.

Conventions (same as the public TAEHV weights):
- videos are N,T,C,H,W RGB in [0, 1] (time before channels);
- latents are N,T,C,H,W, unscaled: exactly what the diffusion model consumes;
- `state_dict()` keys are positions in two `nn.Sequential` containers, `encoder` and `decoder`,
  so that public files (`taehv.pth`, `taecvx.pth`, `taew2_1.pth`, ...) load with strict=True.

The model is built from explicit arguments (variant, patch size, latent channels, time and space
flags, decoder kind, chunking). `TAEHV.from_pretrained` infers what it can from tensor shapes and
reads `model_info.json` beside the file for the rest; without one, a public file name
(`taecvx.pth`) picks among the variants whose shapes the file has.

Frame arithmetic comes from the time factors and the chunk rule, never from literal counts. It is
available on `TAEHVArgs` without building a model (`VARIANTS["taeh3"].latent_frame_count(22)`,
what training/config/schema.py should call) and on the model (`model.latent_frame_count(22)`):
- `t_downscale`, `t_upscale`: 2 ** (time stages switched on) in the encoder / decoder
  (4 for most variants, 8 for taeltx*); `frames_to_trim = t_upscale - 1`;
- `latent_frame_count(n_frames)`: latents `encode_video` returns for n frames;
- `decoded_frame_count(n_latents)`: frames `decode_video` returns for t latents;
- `frame_rule()`: (m, r) such that clips of m*k + r frames decode back to as many frames
  (4k+1; taecvx 8k+1; taeltx* 8k+1; taeh3 17k+5); `is_valid_frame_count(n)`,
  `valid_frame_counts(limit)` list them.
Chunked variants (`chunking="minimax_h3"`, taeh3) follow the MiniMax H3 VAE: the encoder pads T
with the last frame to whole 17-frame chunks, puts zero frames in front of each chunk up to a
multiple of t_downscale (3 -> 20 frames, 5 latents) and encodes every chunk with empty memory,
then drops the clip's last 3 latents; the decoder runs all latents as one sequence, drops the
first frames_to_trim frames of every 20-frame chunk and the last 3 x t_upscale frames.

Streaming: `StreamingTAEHV(model)` is upstream's API (`encode(x=None)` -> one latent or None,
`decode(x=None)` -> one frame or None, `flush_encoder()`, `flush_decoder()`, `flush()`, `reset()`);
`FrameStreamer` is this project's older list-returning API on single 4-D frames.

The package, one concern per file: `blocks.py` (the building blocks and the encoder / decoder
layouts; their attribute names are the state-dict keys), `runners.py` (a Sequential run over time,
all frames at once or one at a time), `model.py` (the `TAEHV` module), `weights.py` (weight files,
model_info.json, arguments inferred from shapes), `streaming.py` (the streaming APIs).
"""

from models.taehv.blocks import (
    MEMORY_BLOCKS,
    Clamp,
    MemBlock,
    SuperMemBlock,
    TGrow,
    TPool,
    WideMemBlock,
    build_base_decoder,
    build_encoder,
    build_super_decoder,
    conv,
)
from models.taehv.model import TAEHV, parameter_count
from models.taehv.runners import SequentialRunner, pad_with_last_frame, run_parallel, run_sequential
from models.taehv.streaming import FrameStreamer, StreamingTAEHV
from models.taehv.weights import (
    EXPORT_FILE_STEM,
    MODEL_INFO_FILENAME,
    args_metadata,
    infer_args_from_state_dict,
    load_state_dict_file,
    narrow_tgrow_weights,
    read_model_info,
    variant_named_by_file,
    write_model_info,
)

# the variants are plain data in models/variants.py (the launcher's config check reads them without torch)
from models.variants import BASE_LAYOUT_WIDTHS, VARIANTS, TAEHVArgs, check_args, resolve_args

__all__ = [
    "BASE_LAYOUT_WIDTHS", "EXPORT_FILE_STEM", "MEMORY_BLOCKS", "MODEL_INFO_FILENAME", "TAEHV", "VARIANTS", "Clamp",
    "FrameStreamer", "MemBlock", "SequentialRunner", "StreamingTAEHV", "SuperMemBlock", "TAEHVArgs", "TGrow", "TPool",
    "WideMemBlock", "args_metadata", "build_base_decoder", "build_encoder", "build_super_decoder", "check_args", "conv",
    "infer_args_from_state_dict", "load_state_dict_file", "narrow_tgrow_weights", "pad_with_last_frame",
    "parameter_count", "read_model_info", "resolve_args", "run_parallel", "run_sequential", "variant_named_by_file",
    "write_model_info",
]
