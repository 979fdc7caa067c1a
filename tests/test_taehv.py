import json
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import REFERENCE
from safetensors.torch import save_file

from models.taehv import (
    TAEHV,
    VARIANTS,
    TAEHVArgs,
    FrameStreamer,
    StreamingTAEHV,
    parameter_count,
    run_parallel,
    run_sequential,
    write_model_info,
)

SPEC_PATH = REFERENCE / "taehv_state_dict_spec.json"

# Published parameter counts (reference README / spec); checked even when ../shared is absent.
PUBLISHED_PARAMS = {
    "taehv": 11_315_539,
    "taecvx": 11_315_539,
    "taew2_1": 11_315_539,
    "taehv1_5": 11_372_012,
    "taew2_2": 11_418_108,
    "taehv1_5_super": 20_470_572,
    "taew2_2_super": 20_487_996,
    "taeltx_2": 11_759_728,
    "taeltx2_3": 11_759_728,
    "taeltx2_3_wide": 30_173_104,
    "taeh3": 11_348_964,
}


def spec_kwargs(entry: dict) -> dict:
    """The spec's upstream-style kwargs as our construction arguments."""
    kwargs = dict(entry["kwargs"])
    if kwargs.pop("arch_variant", "base") == "super":
        kwargs["decoder_kind"] = "super"
    if "decoder" in kwargs:  # e.g. "wide (upstream branch 2026_03_11_taeltx23_wide)"
        kwargs["decoder_kind"] = kwargs.pop("decoder").split()[0]
    if "chunking" in kwargs:  # e.g. "MiniMax H3 (see README)"
        assert kwargs["chunking"].startswith("MiniMax H3"), kwargs["chunking"]
        kwargs["chunking"] = "minimax_h3"
    return kwargs


def random_state_dict(shapes: dict, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        k: (torch.randn(shape, generator=generator) * 0.05 if shape else torch.tensor(0))
        for k, shape in shapes.items()
    }


def lively(model: TAEHV) -> TAEHV:
    """Scale up the from-scratch init's small output layer, so decoded frames vary (std ~0.15-0.4, not ~0.02)
    and a 1e-4 agreement between two ways of running the model means something."""
    model.decoder[-1].weight.data.mul_(10)
    return model


def small_video(model: TAEHV, frames: int, seed: int = 0, size: int | None = None) -> torch.Tensor:
    size = size or 16 * model.patch_size
    return torch.rand(2, frames, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("variant", sorted(PUBLISHED_PARAMS))
def test_parameter_count_matches_published(variant):
    assert parameter_count(TAEHV(variant)) == PUBLISHED_PARAMS[variant]


def spec_variants() -> list:
    """One case per variant of the reference spec (all of them are built here)."""
    if not SPEC_PATH.is_file():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{SPEC_PATH} not present (../shared is optional)"))]
    return list(json.loads(SPEC_PATH.read_text()))


def test_every_spec_variant_is_built():
    if SPEC_PATH.is_file():
        assert set(json.loads(SPEC_PATH.read_text())) <= set(VARIANTS)


@pytest.mark.parametrize("variant", spec_variants())
def test_state_dict_keys_and_shapes_match_spec(taehv_spec, variant):
    entry = taehv_spec[variant]
    model = TAEHV(variant, **spec_kwargs(entry))
    assert model.args == VARIANTS[variant]  # the spec's kwargs are exactly the variant's defaults
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert shapes == entry["state_dict"], variant
    assert parameter_count(model) == entry["n_params"]
    assert (model.t_downscale, model.t_upscale, model.frames_to_trim) == (
        entry["t_downscale"],
        entry["t_upscale"],
        entry["frames_to_trim"],
    )


@pytest.mark.parametrize("variant", spec_variants())
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_spec_shaped_file_loads_strict_with_and_without_variant(taehv_spec, tmp_path, suffix, variant):
    entry = taehv_spec[variant]
    state_dict = random_state_dict(entry["state_dict"])
    public, path = tmp_path / f"{variant}{suffix}", tmp_path / f"weights{suffix}"  # the public name; one telling nothing
    for file in (public, path):
        if suffix == ".pth":
            torch.save(state_dict, file)
        else:
            save_file(state_dict, str(file))
    named = TAEHV.from_pretrained(path, variant=variant)
    assert TAEHV.from_pretrained(public).args == named.args  # the public file name tells the variant
    if named.args.chunk is not None:  # shapes cannot show the chunking: refused, then model_info.json
        with pytest.raises(ValueError, match=f"pass variant='{variant}' or keep model_info.json"):
            TAEHV.from_pretrained(path)
        write_model_info(named, tmp_path)
    inferred = TAEHV.from_pretrained(path)
    assert inferred.args.chunking == named.args.chunking
    for model in (named, inferred):
        loaded = model.state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in state_dict.items()), variant
    assert (inferred.patch_size, inferred.latent_channels, inferred.args.decoder_kind) == (
        named.patch_size,
        named.latent_channels,
        named.args.decoder_kind,
    )


def test_mismatched_file_names_expected_variant_and_first_difference(tmp_path):
    path = tmp_path / "weights.pth"
    torch.save(TAEHV("taehv1_5").state_dict(), path)
    with pytest.raises(ValueError) as error:
        TAEHV.from_pretrained(path, variant="taehv")
    message = str(error.value)
    assert "'taehv'" in message and str(path) in message
    assert "encoder.0.weight" in message and "(64, 12, 3, 3)" in message and "(64, 3, 3, 3)" in message


def test_truncated_file_is_a_clear_error(tmp_path):
    path = tmp_path / "taehv.pth"
    torch.save(TAEHV("taehv").state_dict(), path)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="cannot read TAEHV weights from .*taehv.pth"):
        TAEHV.from_pretrained(path)


def test_model_info_supplies_what_shapes_cannot_tell(tmp_path):
    source = TAEHV("taecvx")
    torch.save(source.state_dict(), tmp_path / "taehv.pth")  # the name of every export: it tells nothing
    with pytest.warns(UserWarning, match=r"loaded as 'taehv' \(taecvx would decode other frame counts\); .*--variant"):
        assert TAEHV.from_pretrained(tmp_path / "taehv.pth").variant == "taehv"  # shapes alone: generic, said so
    write_model_info(source, tmp_path, step=10)
    model = TAEHV.from_pretrained(tmp_path / "taehv.pth")
    assert model.variant == "taecvx" and model.args.cogvideox_trim_rule
    info = json.loads((tmp_path / "model_info.json").read_text())
    assert info["step"] == 10 and info["model_args"]["variant"] == "taecvx"


def test_disabled_time_upscale_keeps_last_time_step_of_tgrow(tmp_path):
    full = TAEHV("taehv")
    torch.save(full.state_dict(), tmp_path / "taehv.pth")
    narrow = TAEHV.from_pretrained(tmp_path / "taehv.pth", variant="taehv", decoder_time_upscale=(False, False, True))
    assert narrow.t_upscale == 2
    trained = full.state_dict()["decoder.13.conv.weight"]  # 256 = 2 steps x 128 channels
    assert torch.equal(narrow.state_dict()["decoder.13.conv.weight"], trained[-128:])


def test_shapes_tell_ltx_and_wide_but_not_h3(tmp_path):
    path = tmp_path / "weights.pth"  # a name that tells nothing: shapes alone
    for variant, inferred_as in [("taeltx_2", "taeltx_2"), ("taeltx2_3", "taeltx_2"), ("taeltx2_3_wide", "taeltx2_3_wide")]:
        torch.save(TAEHV(variant).state_dict(), path)
        model = TAEHV.from_pretrained(path)
        assert model.args == VARIANTS[inferred_as]  # taeltx2_3 has taeltx_2's shapes: only the name differs
    torch.save(TAEHV("taeh3").state_dict(), path)
    with pytest.raises(ValueError) as error:
        TAEHV.from_pretrained(path)
    message = str(error.value)
    assert "\n" not in message and "variant='taeh3'" in message and "model_info.json" in message
    assert TAEHV.from_pretrained(path, variant="taeh3").args.chunking == "minimax_h3"


@pytest.mark.parametrize("name, source, expected", [
    ("taecvx.pth", "taecvx", "taecvx"),  # CogVideoX's trim rule comes with the name
    ("taew2_1.safetensors", "taew2_1", "taew2_1"),
    ("taeos1_3.pth", "taeos1_3", "taeos1_3"),
    ("taecvx_ema.pth", "taecvx", "taecvx"),
    ("taeltx2_3.pth", "taeltx2_3", "taeltx2_3"),
    ("taeh3.pth", "taeh3", "taeh3"),
])
def test_public_file_names_tell_variants_with_the_same_shapes(tmp_path, name, source, expected):
    path = tmp_path / name
    state_dict = TAEHV(source).state_dict()
    if name.endswith(".safetensors"):
        save_file(state_dict, str(path))
    else:
        torch.save(state_dict, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a name that tells is not a guess: no warning
        model = TAEHV.from_pretrained(path)
    assert model.args == VARIANTS[expected]


def test_a_file_name_never_overrides_the_shapes(tmp_path):
    path = tmp_path / "taehv1_5.pth"  # names a patch-2 variant, holds patch-1 weights
    torch.save(TAEHV("taecvx").state_dict(), path)
    with pytest.warns(UserWarning, match="taehv, taecvx, taew2_1, taeos1_3 alike"):
        assert TAEHV.from_pretrained(path).variant == "taehv"


# (variant, frames, square size): sizes are the smallest each variant takes (latents of 1x1)
NEW_VARIANT_CASES = [
    ("taeltx_2", 1, 32),
    ("taeltx_2", 9, 32),
    ("taeltx_2", 17, 32),
    ("taeltx2_3_wide", 8, 32),
    ("taeltx2_3_wide", 17, 32),
    ("taeh3", 22, 16),
    ("taeh3", 39, 16),
    ("taeh3", 30, 16),
]


@pytest.mark.parametrize(
    ("variant", "frames", "size"),
    [(v, f, None) for v in ("taehv", "taecvx", "taehv1_5", "taehv1_5_super") for f in (1, 4, 7, 10)] + NEW_VARIANT_CASES,
)
def test_parallel_equals_sequential(variant, frames, size):
    torch.manual_seed(0)
    model = lively(TAEHV(variant).eval())
    video = small_video(model, frames, size=size)
    with torch.no_grad():
        latents = model.encode_video(video)
        assert (latents - model.encode_video(video, parallel=False)).abs().max() < 1e-4
        # compare the decoder before the final clamp too, so saturated outputs cannot hide errors
        raw_parallel = run_parallel(model.decoder, latents)
        raw_sequential = run_sequential(model.decoder, latents)
        assert (raw_parallel - raw_sequential).abs().max() < 1e-4
        assert (model.decode_video(latents) - model.decode_video(latents, parallel=False)).abs().max() < 1e-4


def test_taeh3_follows_the_chunk_recipe_step_by_step():
    """The README's recipe written out chunk by chunk, against the batched implementation."""
    torch.manual_seed(0)
    model = lively(TAEHV("taeh3").eval())
    video = small_video(model, 30, size=16)  # not 17n+5: the end padding and both drops matter
    with torch.no_grad():
        x = F.pixel_unshuffle(video.flatten(0, 1), 2).unflatten(0, video.shape[:2])
        x = torch.cat([x, x[:, -1:].repeat(1, 34 - 30, 1, 1, 1)], 1)  # repeat the last frame to 2 x 17
        chunks = [torch.cat([torch.zeros_like(x[:, :3]), x[:, i : i + 17]], 1) for i in (0, 17)]  # 3 zeros in front
        expected_latents = torch.cat([run_parallel(model.encoder, c) for c in chunks], 1)[:, :-3]  # empty memory per chunk
        latents = model.encode_video(video)
        assert latents.shape[1] == 7 == model.latent_frame_count(30)
        assert (latents - expected_latents).abs().max() < 1e-5

        raw = run_parallel(model.decoder, latents)  # one sequence, memory across chunks: 28 frames
        raw = F.pixel_shuffle(raw.flatten(0, 1), 2).unflatten(0, raw.shape[:2]).clamp(0, 1)
        raw = torch.cat([raw, torch.zeros_like(raw[:, :12])], 1)  # zero frames up to 2 x 20
        expected_frames = torch.cat([raw[:, 3:20], raw[:, 23:40]], 1)[:, :-12]
        decoded = model.decode_video(latents)
        assert decoded.shape[1] == 22 == model.decoded_frame_count(7)
        assert (decoded - expected_frames).abs().max() < 1e-5


# frames -> (latents, decoded frames) per time rule; the literals here check the derived arithmetic
EXPECTED_COUNTS = {
    "taehv": {1: (1, 1), 5: (2, 5), 8: (2, 5), 9: (3, 9), 12: (3, 9), 13: (4, 13)},
    "taecvx": {1: (1, 1), 5: (2, 8), 8: (2, 8), 9: (3, 9), 12: (3, 9), 13: (4, 16)},
    "taeltx_2": {1: (1, 1), 8: (1, 1), 9: (2, 9), 16: (2, 9), 17: (3, 17), 25: (4, 25)},
    "taeh3": {1: (2, 5), 5: (2, 5), 17: (2, 5), 22: (7, 22), 30: (7, 22), 34: (7, 22), 39: (12, 39)},
}
FAMILY = {"taecvx": "taecvx", "taeltx_2": "taeltx_2", "taeltx2_3": "taeltx_2", "taeltx2_3_wide": "taeltx_2", "taeh3": "taeh3"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_frame_counts_per_variant(variant):
    model = TAEHV(variant).eval()
    size = model.spatial_downscale * 2
    with torch.no_grad():
        for frames, (n_latents, n_decoded) in EXPECTED_COUNTS[FAMILY.get(variant, "taehv")].items():
            latents = model.encode_video(small_video(model, frames, size=size))
            assert latents.shape[1:] == (n_latents, model.latent_channels, 2, 2) and model.latent_frame_count(frames) == n_latents
            decoded = model.decode_video(latents)
            assert decoded.shape[1] == n_decoded == model.decoded_frame_count(n_latents)
            assert decoded.shape[2:] == (3, size, size)
            assert 0 <= decoded.min() and decoded.max() <= 1


@pytest.mark.parametrize(
    ("variant", "rule", "valid"),
    [
        ("taehv", (4, 1), list(range(1, 41, 4))),
        ("taew2_2", (4, 1), list(range(1, 41, 4))),
        ("taecvx", (8, 1), list(range(1, 41, 8))),
        ("taeltx_2", (8, 1), list(range(1, 41, 8))),
        ("taeltx2_3_wide", (8, 1), list(range(1, 41, 8))),
        ("taeh3", (17, 5), [5, 22, 39]),
    ],
)
def test_frame_rule_and_valid_counts(variant, rule, valid):
    args = VARIANTS[variant]  # answers without building a model (what training/config/schema.py needs)
    assert args.frame_rule() == rule and args.valid_frame_counts(40) == valid
    for n in range(1, 41):
        round_trip = args.decoded_frame_count(args.latent_frame_count(n))
        assert args.is_valid_frame_count(n) == (n in valid) and (round_trip == n or n not in valid)


def test_taeh3_decodes_any_latent_count_with_the_counted_frames():
    model = TAEHV("taeh3").eval()
    with torch.no_grad():
        for n_latents in range(1, 13):
            decoded = model.decode_video(torch.randn(1, n_latents, 24, 1, 1))
            assert decoded.shape[1] == model.decoded_frame_count(n_latents) == 17 * -(-n_latents // 5) - 12


def test_cogvideox_frame_counts_match_cogvideox():
    model = TAEHV("taecvx").eval()
    with torch.no_grad():
        decoded = model.decode_video(torch.randn(1, 13, 16, 2, 2))  # 49 frames -> 13 latents
    assert decoded.shape[1] == 49


def drain(first, more) -> list:
    """first result plus all further non-None results of more()."""
    results = []
    while first is not None:
        results.append(first)
        first = more()
    return results


STREAMING_CASES = [("taehv", 9, None), ("taew2_2", 6, None), ("taeltx_2", 17, 32), ("taeltx2_3_wide", 9, 32),
                   ("taeh3", 22, 16), ("taeh3", 39, 16)]


@pytest.mark.parametrize(("variant", "frames", "size"), STREAMING_CASES)
def test_streaming_api_equals_whole_video(variant, frames, size):
    torch.manual_seed(0)
    model = lively(TAEHV(variant).eval())
    video = small_video(model, frames, size=size)
    with torch.no_grad():
        latents = model.encode_video(video)
        decoded = model.decode_video(latents)

    stream = StreamingTAEHV(model)
    streamed = [z for t in range(frames) for z in drain(stream.encode(video[:, t : t + 1]), stream.encode)]
    streamed += stream.flush_encoder()
    assert all(z.shape == (2, 1, *latents.shape[2:]) for z in streamed)
    assert (torch.cat(streamed, 1) - latents).abs().max() < 1e-4

    frames_per_latent = [len(drain(stream.decode(latents[:, t : t + 1]), stream.decode)) for t in range(latents.shape[1])]
    assert sum(frames_per_latent) == decoded.shape[1]
    if model.args.chunk is None:  # one frame per call: the first latent gives what survives the trim
        assert frames_per_latent == [1] + [model.t_upscale] * (latents.shape[1] - 1)
    stream.reset()
    out = drain(stream.decode(latents), stream.decode)  # all latents at once, still one frame per call
    assert all(f.shape == (2, 1, *decoded.shape[2:]) for f in out)
    assert (torch.cat(out, 1) - decoded).abs().max() < 1e-4

    stream.reset()  # video to video, as in upstream's example
    out = [f for t in range(frames) if (f := stream.decode(stream.encode(video[:, t : t + 1]))) is not None]
    out += stream.flush()
    assert (torch.cat(out, 1) - decoded).abs().max() < 1e-4


def test_streaming_cogvideox_trims_only_when_told_the_count():
    model = TAEHV("taecvx").eval()
    latents = torch.randn(1, 3, 16, 2, 2)
    with torch.no_grad():
        decoded = model.decode_video(latents)  # odd count: trimmed, 9 frames
    untold = StreamingTAEHV(model)  # upstream: never trims CogVideoX while streaming
    assert len(drain(untold.decode(latents), untold.decode)) == 12
    told = StreamingTAEHV(model, num_latent_frames=3)
    assert (torch.cat(drain(told.decode(latents), told.decode), 1) - decoded).abs().max() < 1e-4


@pytest.mark.parametrize(("variant", "frames"), [("taehv", 6), ("taecvx", 9), ("taew2_2", 9), ("taeh3", 22)])
def test_frame_streamer_equals_whole_video(variant, frames):
    torch.manual_seed(0)
    model = lively(TAEHV(variant).eval())
    video = small_video(model, frames, size=model.spatial_downscale)
    with torch.no_grad():
        latents = model.encode_video(video)
        decoded = model.decode_video(latents)
    stream = FrameStreamer(model, num_latent_frames=latents.shape[1])
    streamed_latents = [z for t in range(frames) for z in stream.encode(video[:, t])] + stream.flush()
    assert (torch.stack(streamed_latents, 1) - latents).abs().max() < 1e-4
    streamed_frames = [f for t in range(latents.shape[1]) for f in stream.decode(latents[:, t])]
    assert (torch.stack(streamed_frames, 1) - decoded).abs().max() < 1e-4


def test_frame_streamer_cogvideox_needs_latent_count():
    with pytest.raises(ValueError, match="num_latent_frames"):
        FrameStreamer(TAEHV("taecvx"))


def test_gradient_checkpointing_changes_no_values():
    torch.manual_seed(0)
    model = TAEHV("taehv").train()
    video = small_video(model, 8)

    def loss_and_grads():
        model.zero_grad()
        loss = (model(video) - video[:, 3:]).pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    plain_loss, plain_grads = loss_and_grads()
    model.set_gradient_checkpointing(True)
    checkpointed_loss, checkpointed_grads = loss_and_grads()
    assert torch.allclose(plain_loss, checkpointed_loss, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_grads, checkpointed_grads))


def test_decoder_output_bias_starts_at_half():
    model = TAEHV("taehv")
    assert torch.all(model.decoder[-1].bias == 0.5)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown TAEHV variant 'taehx'"):
        TAEHV("taehx")
    with pytest.raises(ValueError, match="latent_channel"):
        TAEHV("taehv", latent_channel=16)
    with pytest.raises(ValueError, match="multiples of 16"):
        TAEHV("taehv1_5").encode_video(torch.rand(1, 4, 3, 24, 24))


# What upstream's taehv.py (madebyollin/taehv, main) builds from a weight file's path, a fact of its
# source: each text found anywhere in the path sets these arguments; without any, the default ones.
UPSTREAM_PATH_RULES = {
    "taecvx": dict(cogvideox_trim_rule=True),
    "taeh3": dict(patch_size=2, latent_channels=24, chunking="minimax_h3"),
    "taew2_2": dict(patch_size=2, latent_channels=48),
    "taehv1_5": dict(patch_size=2, latent_channels=32),
    "taeltx": dict(patch_size=4, latent_channels=128, encoder_time_downscale=(True, True, True),
                   decoder_time_upscale=(True, True, True)),
    "_super": dict(decoder_kind="super"),
}


def built_by_upstream_from(path: str) -> TAEHVArgs:
    args = TAEHVArgs("upstream")
    for marker, fields in UPSTREAM_PATH_RULES.items():
        if marker in path:
            args = replace(args, **fields)
    return args


class MainProcess:
    is_main_process = True  # export_model writes on rank 0 only


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_an_export_is_named_so_that_its_name_alone_builds_its_variant(tmp_path, variant):
    """final/ and best_model/ hold <variant>.pth and <variant>.safetensors: without model_info.json the
    name alone gives back every construction argument, ours and upstream's (test_upstream_parity loads
    the export in upstream's own module where a checkout is given)."""
    from training.loop.exports import export_model

    model = TAEHV(variant)
    export_model(MainProcess(), model.state_dict(), model, tmp_path / "final", step=3, metrics={})
    names = sorted(p.name for p in (tmp_path / "final").iterdir())
    assert names == sorted([f"{variant}.pth", f"{variant}.safetensors", "model_info.json"])
    (tmp_path / "final" / "model_info.json").unlink()
    assert TAEHV.from_pretrained(tmp_path / "final" / f"{variant}.pth").args == VARIANTS[variant]
    assert TAEHV.from_pretrained(tmp_path / "final").args == VARIANTS[variant]  # the folder: its export
    if VARIANTS[variant].decoder_kind != "wide":  # the wide decoder is on an upstream branch, not main
        assert built_by_upstream_from(f"output/run/final/{variant}.pth") == replace(VARIANTS[variant], variant="upstream")
