"""Turn a training checkpoint (any process count, ZeRO stage or DDP) into one public-format TAEHV
file that loads wherever TAEHV weights load.

    python -m scripts.convert_checkpoint output/run/checkpoints/checkpoint-5000 --out taehv.safetensors \
        [--weights ema|model] [--dtype fp32|bf16|fp16] [--variant taecvx]

--weights ema (default): the EMA weights, what the run validates and exports to final/;
--weights model: the optimizer's fp32 master weights (gathered from the ZeRO shards at save time,
in the checkpoint's full_state.pt). A model_info.json is written beside the output; the variant
comes from the run's resolved_config.json unless --variant is given. Written under a temporary
name and renamed, so an existing file is never left half-written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from models.taehv import TAEHV, args_metadata, write_model_info
from models.variants import TAEHVArgs
from training.base.fast_exit import exit_now
from training.run.checkpoint_files import read_state
from training.run.elastic import FULL_STATE

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def checkpoint_weights(folder: Path, which: str) -> dict[str, torch.Tensor]:
    if which == "model":
        path = folder / FULL_STATE
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: this checkpoint predates full states; use --weights ema")
        weights = torch.load(path, map_location="cpu", weights_only=True)["weights"]
        return {name.removeprefix("taehv."): value for name, value in weights.items()}
    state = read_state(folder, "ema")
    if state is not None:
        return dict(state["shadow"])
    raise FileNotFoundError(f"{folder}: no EMA state (the run had ema_decay=0); use --weights model")


def checkpoint_model(folder: Path, which: str = "ema", variant: str | None = None) -> TAEHV:
    """The checkpoint's EMA or master weights in a TAEHV of the run's student (strict load); used
    here and by inference.py."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a checkpoint folder")
    if variant is None:
        config = folder.parent.parent / "resolved_config.json"
        if not config.is_file():
            raise FileNotFoundError(f"{config} not found: pass --variant")
        resolved = json.loads(config.read_text())
        # runs before model_variant=auto recorded only the variant's name
        model = TAEHV(TAEHVArgs.from_json_dict(resolved["student_args"])) if resolved.get("student_args") else TAEHV(resolved["model_variant"])
    else:
        model = TAEHV(variant)
    model.load_state_dict({k: v.float() for k, v in checkpoint_weights(folder, which).items()})
    return model


def convert(folder: Path, out: Path, which: str = "ema", dtype: str = "fp32", variant: str | None = None) -> Path:
    if out.suffix not in (".pth", ".safetensors"):
        raise ValueError(f"--out {out}: use a .pth or .safetensors name")
    model = checkpoint_model(folder, which, variant)
    weights = {k: v.to(DTYPES[dtype]).contiguous() for k, v in model.state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".tmp-{out.name}")
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(weights, str(temporary), metadata=args_metadata(model))
    else:
        torch.save(weights, temporary)
    temporary.replace(out)
    write_model_info(model, out.parent, source=str(folder), weights=which, dtype=dtype)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--weights", choices=("ema", "model"), default="ema")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--variant")
    args = parser.parse_args(argv)
    try:
        path = convert(args.checkpoint, args.out, args.weights, args.dtype, args.variant)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({args.weights} weights, {args.dtype}) and {path.parent / 'model_info.json'}")
    return 0


if __name__ == "__main__":
    exit_now(main())
