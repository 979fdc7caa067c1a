"""The inputs a config points at (weights, reference VAE, data, LPIPS files, buckets): each missing or
unreadable one is one line with its fix; a public file's fix names where it comes from and the command
that fetches it (models/public_files.py, the families' hub repositories)."""

from __future__ import annotations

import os
from pathlib import Path

from models.public_files import PUBLIC_TAEHV_BRANCHES, lpips_files_hint, missing_lpips_files, taehv_weights_hint
from models.reference_families import family_named_by, hub_repo_for
from models.variants import export_in
from training.base.storage import ObjectStore, is_remote
from training.config.schema import HUB_ID, ConfigError, TrainConfig
from training.config.terms import active_terms
from training.config.views import latent_space, student_of


def hub_model_is_cached(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(model_id, name), str) for name in ("vae/config.json", "config.json"))


def reference_vae_path_problem(family: str, path: str, name: str, shown: str, assign, default: str = "") -> str:
    """What keeps the reference VAE at `path` (a local diffusers folder, or a hub id in the Hugging
    Face cache: nothing is downloaded at start) from loading, in one line with its fix; '' when
    nothing does. `name`, `shown`: the setting, and it with the value as the user gave it;
    assign(folder): how they set another; `default`: the config's default, a local folder's name.
    `family` '': the one the folder's name suggests, if any."""
    folder = Path(path)
    named = family_named_by(path)
    other = named if named and named != family else ""  # the folder's name says another family
    family = family or named
    public = hub_repo_for(family, path if not other else "")
    local = path if path != default or not public else f"pretrained/{public.split('/')[-1]}"
    example = (f" (e.g. hf download {public} --include 'vae/*' --local-dir {local}"
               + ("" if local == path else f", then {assign(local)}") + ")" if public else "")
    if other and family != other:
        example += (f"; its name suggests the {other} family: with ref_vae_family={other} (or auto), "
                    f"hf download {hub_repo_for(other, path)} --include 'vae/*' --local-dir {path}")
    what = f"the diffusers {family} pipeline" if family else "a diffusers pipeline"
    if folder.is_dir():
        if not (folder / "config.json").is_file() and not (folder / "vae" / "config.json").is_file():
            return f"{shown} holds no config.json (nor vae/config.json): point it at {what} folder or its vae/ subfolder"
    elif not HUB_ID.match(path) or path == default:  # the default names a local folder
        return f"{shown} is not a local folder: put {what} in a local folder and set {name} to it{example}"
    elif not hub_model_is_cached(path):  # every rank of every node would download it at start
        return (f"{shown} is no local folder and not in the Hugging Face cache: download it once on each machine "
                f"(hf download {path} --include 'vae/*'), or set {name} to a local copy of {what}")
    return ""


def input_problems(c: TrainConfig) -> list[str]:
    """Every missing or unreadable input the config points at, one line each with its fix (the dry
    run lists them all; a launch stops at the first)."""
    problems = []

    def unreadable(path: Path, folder: bool = False) -> bool:
        return not os.access(path, os.R_OK | (os.X_OK if folder else 0))

    if c.pretrained_model_path:
        path = Path(c.pretrained_model_path)
        if path.is_dir():  # an export folder (a previous run's final/): the weight file it holds
            path = export_in(path) or path
        if not path.is_file():
            problems.append(f"pretrained_model_path={c.pretrained_model_path!r} does not exist: {starting_weights_fix(c, path)}; "
                            "or fix the path, or set it to '' to train from scratch")
        elif unreadable(path):
            problems.append(f"pretrained_model_path={c.pretrained_model_path!r} cannot be read: fix its permissions")
    if c.latent_cache:
        from training.base.latent_format import CacheError, check_compatible

        if not c.use_ref_vae:
            problems.append("latent_cache is set but use_ref_vae=false: a cache holds reference latents; set use_ref_vae=true")
        else:
            try:
                check_compatible(Path(c.latent_cache), c, latent_space(c))
            except CacheError as error:
                problems.append(str(error))
    elif c.use_ref_vae:
        default = TrainConfig.__dataclass_fields__["ref_vae_path"].default
        problem = reference_vae_path_problem(c.reference_family, c.ref_vae_path, "ref_vae_path", f"ref_vae_path={c.ref_vae_path!r}",
                                             lambda value: f"--set ref_vae_path={value}", default)
        if problem:
            problems.append(problem)
    remote = [key for key in ("data_root", "index_path") if is_remote(getattr(c, key))]
    for key in remote:  # one line naming the bucket, endpoint or credentials, before anything starts
        problem = ObjectStore(getattr(c, key).rpartition("/")[0] if key == "index_path" else c.data_root, retry_s=0).problem()
        if problem:
            problems.append(problem.replace("data_root=", f"{key}=", 1))
    if not c.sample_data and "data_root" not in remote:
        root = Path(c.data_root)
        if not root.is_dir():
            problems.append(f"data_root={c.data_root!r} is not a folder: fix the path (or set sample_data=real)")
        elif unreadable(root, folder=True):
            problems.append(f"data_root={c.data_root!r} cannot be read: fix its permissions")
    if c.index_path and "index_path" not in remote:
        if not Path(c.index_path).is_file():
            problems.append(f"index_path={c.index_path!r} does not exist: build it with scripts/build_index.py, "
                            "fix the path, or set it to '' to scan data_root")
        elif unreadable(Path(c.index_path)):
            problems.append(f"index_path={c.index_path!r} cannot be read: fix its permissions")
    for key, name in (("lpips_weights_path", "alex.pth"), ("lpips_backbone_path", "alexnet-owt-7be5be79.pth")):
        if getattr(c, key) and not Path(getattr(c, key)).is_file():
            problems.append(f"{key}={getattr(c, key)!r} does not exist: fix the path, or fetch the file "
                            f"({lpips_files_hint({name: getattr(c, key)})})")
    needs_lpips = [f"{t.weight_key}={getattr(c, t.weight_key)}" for t in active_terms(c) if t.module == "lpips"]
    needs_lpips += [f"best_metric={c.best_metric}"] * ("lpips" in c.best_metric)
    if needs_lpips and not any(p.startswith("lpips_") for p in problems):
        from models.metrics import LPIPSUnavailable, find_lpips_weights

        try:
            find_lpips_weights(c.lpips_backbone_path, c.lpips_weights_path)
        except LPIPSUnavailable as error:
            import torch

            missing = missing_lpips_files(c.lpips_backbone_path, c.lpips_weights_path, torch.hub.get_dir())
            problems.append(f"{' and '.join(needs_lpips)} needs LPIPS weights: {error}; {lpips_files_hint(missing)}")
    return problems


def starting_weights_fix(c: TrainConfig, path: Path) -> str:
    """Where the public weights a missing pretrained_model_path names come from, and the command that
    fetches them: the file's own variant when its name is a public one (checkpoints/taecvx.pth), else
    the run's student's, at checkpoints/<variant>.pth."""
    if path.stem in PUBLIC_TAEHV_BRANCHES:
        return taehv_weights_hint(path.stem, path)
    variant = student_of(c).variant
    if variant not in PUBLIC_TAEHV_BRANCHES:
        return f"{variant} has no public weights to start from"
    suggested = f"checkpoints/{variant}.pth"
    return f"{taehv_weights_hint(variant, suggested)}, then --set pretrained_model_path={suggested}"


def data_root_problem(c: TrainConfig) -> str:
    """'' or one line when a local data_root folder holds fewer than the 2 clips a run needs (one is
    held out for validation). The walk stops at the second clip, so a large folder costs little. The
    dry run and scripts/validate_setup.py name it; a launch stops on it with exit 3 (a data error)."""
    from training.base.formats import PREPARED_MARKER, VIDEO_EXTENSIONS
    from training.base.storage import is_remote

    root = Path(c.data_root)
    if c.sample_data or c.index_path or is_remote(c.data_root) or not root.is_dir() or (root / PREPARED_MARKER).is_file():
        return ""
    found = 0
    for folder, _, files in os.walk(root):
        found += sum(Path(name).suffix.lower() in VIDEO_EXTENSIONS for name in files)
        if found >= 2:
            return ""
    return too_few_clips(c.data_root, found)


def too_few_clips(data_root: str, found: int) -> str:
    if found == 0:
        return f"no video files under {data_root}: check data_root / index_path"
    return (f"only 1 video file under {data_root}: a run needs at least 2 (one is held out for validation); "
            "add clips, or check data_root / index_path")


def check_required_paths(c: TrainConfig) -> None:
    """The first input problem as a one-line ConfigError, with the count of the others."""
    problems = input_problems(c)
    if problems:
        more = f" (and {len(problems) - 1} more: --dry-run lists them all)" if len(problems) > 1 else ""
        raise ConfigError(problems[0] + more)
