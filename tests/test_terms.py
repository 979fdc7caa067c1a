"""The loss-term table (training/config/terms.py): each record names a config weight and a
formula, and the flags a config derives from it are the ones worked out by hand."""

import dataclasses

import pytest

from training.config.schema import TrainConfig
from training.config.terms import LOSS_TERMS, active_terms, needs_module, student_needs
from training.step.losses import TERM_LOSSES


def test_each_term_has_a_float_weight_in_the_config_and_a_formula():
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert len({t.name for t in LOSS_TERMS}) == len({t.weight_key for t in LOSS_TERMS}) == len(LOSS_TERMS)
    for term in LOSS_TERMS:
        assert fields[term.weight_key].type in ("float", float), term
        # local terms by their formula; Seraena's is added across ranks (add_seraena_term)
        assert (term.name in TERM_LOSSES) != term.across_ranks, term
    assert set(TERM_LOSSES) <= {t.name for t in LOSS_TERMS}


OFF = dict(reconstruction_weight=0.0, encoder_weight=0.0, decoder_weight=0.0, perceptual_weight=0.0,
           seraena_weight=0.0, temporal_weight=0.0)


@pytest.mark.parametrize("overrides, terms, latents, roundtrip, reference_decode, modules", [
    # the defaults: distilling with every term but temporal
    ({}, {"encoder", "decoder", "reconstruction", "perceptual", "seraena"}, True, True, True, {"lpips", "seraena"}),
    # decoder-side terms only: the encoder sits idle (DDP's find_unused_parameters)
    (dict(encoder_weight=0.0, reconstruction_weight=0.0), {"decoder", "perceptual", "seraena"}, False, False, True,
     {"lpips", "seraena"}),
    ({**OFF, "encoder_weight": 0.1}, {"encoder"}, True, False, False, set()),
    # autoencoder mode: the judged decode is the round trip
    ({**OFF, "use_ref_vae": False, "temporal_weight": 0.1}, {"temporal"}, False, True, False, set()),
    # without a reference the terms that need it are off whatever their weight
    ({"use_ref_vae": False, "perceptual_weight": 0.0}, {"reconstruction", "seraena"}, False, True, False, {"seraena"}),
])
def test_the_flags_a_config_derives_from_the_table(overrides, terms, latents, roundtrip, reference_decode, modules):
    config = dataclasses.replace(TrainConfig(), **overrides)
    assert {t.name for t in active_terms(config)} == terms
    needs = student_needs(config)
    assert (needs.latents, needs.roundtrip, needs.reference_decode) == (latents, roundtrip, reference_decode)
    assert needs.encode == (latents or roundtrip)
    assert {m for m in ("lpips", "seraena") if needs_module(config, m)} == modules
