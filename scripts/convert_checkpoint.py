"""Turn a training checkpoint (any process count, ZeRO stage or DDP) into one public-format TAEHV
file that loads wherever TAEHV weights load.

    python -m scripts.convert_checkpoint output/run/checkpoints/checkpoint-5000 --out exported/ \
        [--weights ema|model] [--dtype fp32|bf16|fp16] [--variant taecvx]

--out FOLDER writes <variant>.pth and <variant>.safetensors there (taecvx.pth, taew2_2.pth, ...), the
names upstream's taehv.py builds the right architecture from; --out FILE (.pth or .safetensors) one
file, whose name must name the variant as the public files do (taecvx.pth, taecvx_step5000.pth).
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
from models.variants import TAEHVArgs, export_file_names, file_names_variant
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


def output_files(out: Path, variant: str) -> list[Path]:
    """The files --out asks for: a folder gets both public-format files under the variant's name; a
    file name must name the variant, or upstream's taehv.py would build another architecture."""
    if out.suffix not in (".pth", ".safetensors"):
        if out.suffix and not out.is_dir():
            raise ValueError(f"--out {out}: give a folder, or a .pth or .safetensors file name")
        return [out / name for name in export_file_names(variant)]
    if not file_names_variant(out, variant):
        pth, _ = export_file_names(variant)
        raise ValueError(f"--out {out}: the weights are variant {variant}, and upstream's taehv.py (and the tools built on "
                         f"it) pick the architecture from the file name: name it {pth} or {variant}_<anything>{out.suffix}, "
                         "or give a folder")
    return [out]


def convert(folder: Path, out: Path, which: str = "ema", dtype: str = "fp32", variant: str | None = None) -> list[Path]:
    model = checkpoint_model(folder, which, variant)
    paths = output_files(out, model.args.variant)
    weights = {k: v.to(DTYPES[dtype]).contiguous() for k, v in model.state_dict().items()}
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".tmp-{path.name}")
        if path.suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file(weights, str(temporary), metadata=args_metadata(model))
        else:
            torch.save(weights, temporary)
        temporary.replace(path)
    write_model_info(model, paths[0].parent, source=str(folder), weights=which, dtype=dtype)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="a folder (gets <variant>.pth and <variant>.safetensors) "
                        "or a .pth / .safetensors file named for the variant (taecvx.pth)")
    parser.add_argument("--weights", choices=("ema", "model"), default="ema")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--variant")
    args = parser.parse_args(argv)
    try:
        paths = convert(args.checkpoint, args.out, args.weights, args.dtype, args.variant)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {' and '.join(map(str, paths))} ({args.weights} weights, {args.dtype}) and {paths[0].parent / 'model_info.json'}")
    return 0


if __name__ == "__main__":
    exit_now(main())
