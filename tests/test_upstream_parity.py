"""Parity with upstream TAEHV (madebyollin/taehv, file taehv.py): from the same weight file, our
`encode_video` / `decode_video` give what upstream's give, parallel and sequential, so a user can
swap either implementation in for the other.

Needs a copy of upstream's taehv.py: TAEHV_UPSTREAM_DIR=/path/to/a/checkout/of/madebyollin/taehv.
Without it every test here skips. Upstream code is only read from that folder, never copied here.
Variants the given upstream version does not know (its taehv.py tells them by the weight file's
name) skip with the reason; taeh3's network is still compared without its chunking.
"""

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest
import torch

from models.taehv import TAEHV, run_parallel, run_sequential

TOLERANCE = 1e-4

# Text upstream's taehv.py must contain to build each variant from a file named "<variant>.pth":
# upstream picks patch size, latent channels and time flags by looking for these names in the path.
# None: the default architecture, which every upstream version builds. taew2_1 and taeos1_3 are that
# architecture under names upstream has no rule for: the taehv case covers them.
UPSTREAM_MARKERS = {
    "taehv": None,
    "taecvx": '"taecvx"',
    "taehv1_5": '"taehv1_5"',
    "taew2_2": '"taew2_2"',
    "taeltx_2": '"taeltx',
    "taeltx2_3": '"taeltx',
    "taeltx2_3_wide": "WideMemBlock",  # upstream branch 2026_03_11_taeltx23_wide
    "taeh3": '"taeh3"',
    "taehv1_5_super": "arch_variant",
    "taew2_2_super": "arch_variant",
}


class Upstream:
    def __init__(self, folder: Path):
        path = folder / "taehv.py"
        spec = importlib.util.spec_from_file_location("taehv_upstream", path)
        self.module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.module)
        self.source = path.read_text()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        try:
            commit = subprocess.run(
                ["git", "-C", str(folder), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "not a git checkout"
        self.label = f"{path} ({commit}, sha256 {digest})"

    def missing_support(self, variant: str) -> str | None:
        marker = UPSTREAM_MARKERS[variant]
        if marker is None or marker in self.source:
            return None
        return f"upstream {self.label} does not know {variant} (no {marker} in its source)"

    def build(self, checkpoint: Path, **kwargs):
        """Upstream's TAEHV from a weight file; it loads with strict=True. Upstream looks for variant
        names anywhere in the path it is given, so it gets the bare file name (pytest's folder
        names repeat the test's name, e.g. test_taeh3_...)."""
        cwd = os.getcwd()
        os.chdir(checkpoint.parent)
        try:
            return self.module.TAEHV(checkpoint_path=checkpoint.name, **kwargs).eval()
        finally:
            os.chdir(cwd)


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    folder = os.environ.get("TAEHV_UPSTREAM_DIR")
    if not folder:
        pytest.skip("TAEHV_UPSTREAM_DIR is not set: point it at a checkout of madebyollin/taehv to compare with upstream")
    if not (Path(folder) / "taehv.py").is_file():
        pytest.skip(f"TAEHV_UPSTREAM_DIR={folder} has no taehv.py (expected a checkout of madebyollin/taehv)")
    # these clips are tiny: one thread is faster, and much faster when other processes share the cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Upstream(Path(folder))
    torch.set_num_threads(threads)


def ours_with_random_weights(variant: str, seed: int = 0, **overrides) -> TAEHV:
    """Seeded random weights, with the output layer scaled up so decoded frames vary (std ~0.4, not
    ~0.02) and a 1e-4 agreement means something; many pixels then clip, hence the raw decoder check."""
    torch.manual_seed(seed)
    model = TAEHV(variant, **overrides).eval()
    model.decoder[-1].weight.data.mul_(10)
    return model


def first_frame_count(model: TAEHV) -> int:
    """The shortest valid clip with at least 3 latents (taehv 9, taeltx 17, taeh3 22 = 7 latents)."""
    return next(n for n in model.valid_frame_counts(64) if model.latent_frame_count(n) >= 3)


def max_differences(upstream: Upstream, ours: TAEHV, theirs, frames: int, size: int) -> dict[str, float]:
    """Max |ours - upstream| for encode, decode and the raw decoder (before the final clamp, so
    saturated pixels cannot hide a difference), parallel and sequential."""
    generator = torch.Generator().manual_seed(1)
    video = torch.rand(1, frames, 3, size, size, generator=generator)
    n_latents = ours.latent_frame_count(frames)
    h = size // ours.spatial_downscale
    latents = torch.randn(1, n_latents, ours.latent_channels, h, h, generator=generator)
    found = {}
    with torch.no_grad():
        for parallel in (True, False):
            mode = "parallel" if parallel else "sequential"
            a = ours.encode_video(video.clone(), parallel=parallel)
            b = theirs.encode_video(video.clone(), parallel=parallel, show_progress_bar=False)
            assert a.shape == b.shape, f"encode {mode}: ours {tuple(a.shape)}, upstream {tuple(b.shape)}"
            found[f"encode {mode}"] = (a - b).abs().max().item()
            a = ours.decode_video(latents.clone(), parallel=parallel)
            b = theirs.decode_video(latents.clone(), parallel=parallel, show_progress_bar=False)
            assert a.shape == b.shape, f"decode {mode}: ours {tuple(a.shape)}, upstream {tuple(b.shape)}"
            found[f"decode {mode}"] = (a - b).abs().max().item()
            a = (run_parallel if parallel else run_sequential)(ours.decoder, latents.clone())
            b = upstream.module.apply_model_with_memblocks(theirs.decoder, latents.clone(), parallel, False)
            found[f"raw decoder {mode}"] = (a - b).abs().max().item()
    return found


def check(found: dict[str, float], what: str) -> None:
    print(f"upstream parity {what}: " + ", ".join(f"{k} {v:.2e}" for k, v in found.items()))
    bad = {k: v for k, v in found.items() if not v < TOLERANCE}
    assert not bad, f"{what}: differs from upstream by more than {TOLERANCE}: {bad}"


@pytest.mark.parametrize("variant", list(UPSTREAM_MARKERS))
def test_same_weights_give_upstreams_outputs(upstream, tmp_path, variant):
    """A weight file we save loads strictly into upstream's TAEHV (named as upstream expects, e.g.
    taeltx2_3.pth), and both compute the same latents and frames, parallel and sequential."""
    reason = upstream.missing_support(variant)
    if reason:
        pytest.skip(reason)
    ours = ours_with_random_weights(variant)
    checkpoint = tmp_path / f"{variant}.pth"
    torch.save(ours.state_dict(), checkpoint)
    kwargs = {"arch_variant": "super"} if ours.args.decoder_kind == "super" else {}
    theirs = upstream.build(checkpoint, **kwargs)
    assert (theirs.t_downscale, theirs.t_upscale, theirs.frames_to_trim) == (ours.t_downscale, ours.t_upscale, ours.frames_to_trim)
    size = 2 * ours.spatial_downscale
    check(max_differences(upstream, ours, theirs, first_frame_count(ours), size), f"{variant} ({upstream.label})")


@pytest.mark.parametrize(("variant", "frames"), [("taehv", 7), ("taecvx", 8)])
def test_padding_and_cogvideox_even_latents_match_upstream(upstream, tmp_path, variant, frames):
    """Clips that are not a valid length: the end padding (7 frames -> 2 latents) and CogVideoX's
    even latent count (8 frames -> 2 latents -> 8 frames, no trim) follow upstream."""
    ours = ours_with_random_weights(variant)
    checkpoint = tmp_path / f"{variant}.pth"
    torch.save(ours.state_dict(), checkpoint)
    check(max_differences(upstream, ours, upstream.build(checkpoint), frames, 16), f"{variant}, {frames} frames")


def test_taeh3_network_matches_upstream_without_chunking(upstream, tmp_path):
    """taeh3's layers (patch 2, 24 latents) against upstream's generic TAEHV built with the same
    arguments, chunking switched off on our side: upstream versions without taeh3 support still
    check every weight and block; the chunk rule itself needs an upstream that knows taeh3."""
    ours = ours_with_random_weights("taeh3", chunking="none")
    checkpoint = tmp_path / "h3_network.pth"  # a name upstream does not sniff
    torch.save(ours.state_dict(), checkpoint)
    theirs = upstream.build(checkpoint, patch_size=2, latent_channels=24)
    check(max_differences(upstream, ours, theirs, 9, 32), "taeh3 network, no chunking")


class MainProcess:
    is_main_process = True  # export_model writes on rank 0 only


@pytest.mark.parametrize("variant", list(UPSTREAM_MARKERS))
def test_our_export_loads_in_upstream_by_the_name_we_ship(upstream, tmp_path, variant):
    """What a run exports to final/ (training/loop/exports.py) loads in upstream's TAEHV given only the
    file's path, as a user passes it (no constructor arguments, no model_info.json read): the same
    frame counts and values as our model."""
    from models.variants import export_file_names
    from training.loop.exports import export_model

    reason = upstream.missing_support(variant)
    if reason:
        pytest.skip(reason)
    ours = ours_with_random_weights(variant)
    export_model(MainProcess(), ours.state_dict(), ours, tmp_path / "final", step=1, metrics={})
    pth, _ = export_file_names(variant)
    theirs = upstream.build(tmp_path / "final" / pth)
    assert (theirs.t_downscale, theirs.t_upscale, theirs.frames_to_trim) == (ours.t_downscale, ours.t_upscale, ours.frames_to_trim)
    check(max_differences(upstream, ours, theirs, first_frame_count(ours), 2 * ours.spatial_downscale),
          f"{variant} export ({upstream.label})")
