"""Where the public files a run or an evaluation reads come from, and the command that fetches each
on a machine with internet (plain data, no torch):

- the public TAEHV weights: madebyollin/taehv on GitHub, `<variant>.pth` in its root,
  `safetensors/<variant>.safetensors` beside (raw files);
- LPIPS's two files (models/metrics.py): torchvision's AlexNet backbone, from PyTorch's download
  server, and the v0.1 heads the lpips package ships, from its repository
  (richzhang/PerceptualSimilarity, `lpips/weights/v0.1/alex.pth`).

The reference VAEs' Hugging Face repositories are in their Family records (reference_families.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

TAEHV_REPOSITORY = "madebyollin/taehv"
# the variants with a public file, and the branch it is on (taeltx2_3_wide: a branch of its own, named in the
# repository's README); taeh3 has none
PUBLIC_TAEHV_BRANCHES = {
    **{variant: "main" for variant in ("taehv", "taecvx", "taew2_1", "taeos1_3", "taehv1_5", "taew2_2", "taehv1_5_super",
                                       "taew2_2_super", "taeltx_2", "taeltx2_3")},
    "taeltx2_3_wide": "2026_03_11_taeltx23_wide",
}
# file name -> (what it is, where it comes from); the names are models/metrics.py's BACKBONE_FILE and HEADS_FILE
LPIPS_FILES = {
    "alexnet-owt-7be5be79.pth": ("torchvision's AlexNet", "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"),
    "alex.pth": ("the lpips package's v0.1 heads",
                 "https://github.com/richzhang/PerceptualSimilarity/raw/master/lpips/weights/v0.1/alex.pth"),
}


def fetch_command(path: str | Path, url: str) -> str:
    """The one shell command that writes `url` to `path` (its folders made)."""
    return f"curl -L --create-dirs -o {shlex.quote(str(path))} {url}"


def taehv_weights_url(variant: str, suffix: str = ".pth") -> str:
    """The raw URL of a variant's public file ('' for a variant without one)."""
    branch = PUBLIC_TAEHV_BRANCHES.get(variant)
    if branch is None:
        return ""
    folder = "safetensors/" if suffix == ".safetensors" else ""
    return f"https://github.com/{TAEHV_REPOSITORY}/raw/{branch}/{folder}{variant}{suffix}"


def taehv_weights_hint(variant: str, path: str | Path) -> str:
    """Where the public `variant` weights come from and the command that puts them at `path`."""
    url = taehv_weights_url(variant, Path(path).suffix if Path(path).suffix == ".safetensors" else ".pth")
    if not url:
        return f"{variant} has no public weights in {TAEHV_REPOSITORY}"
    return f"the public {variant} weights are in {TAEHV_REPOSITORY} on GitHub; on a machine with internet: {fetch_command(path, url)}"


def lpips_files_hint(missing: dict[str, str | Path]) -> str:
    """Where each missing LPIPS file comes from (published file name -> the path it is looked for at),
    and the commands that put it there."""
    return "on a machine with internet, " + "; ".join(
        f"{LPIPS_FILES[name][0]}: {fetch_command(path, LPIPS_FILES[name][1])}" for name, path in missing.items())


def missing_lpips_files(backbone_path: str | Path, heads_path: str | Path, hub_dir: str | Path) -> dict[str, Path]:
    """Published file name -> the path models/metrics.py looks for it at (the given path, else
    `<hub_dir>/checkpoints/`), for each that is not there."""
    (backbone, _), (heads, _) = LPIPS_FILES.items()
    paths = {backbone: Path(backbone_path) if backbone_path else Path(hub_dir) / "checkpoints" / backbone,
             heads: Path(heads_path) if heads_path else Path(hub_dir) / "checkpoints" / heads}
    return {name: path for name, path in paths.items() if not path.is_file()}
