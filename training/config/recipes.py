"""Named recipes: config deltas taken from published TAE and video-VAE training recipes, applied on
top of any profile (profile -> recipe -> stage -> --set). Each names its source; where our parts
differ from the source's (Seraena is our only discriminator; the seraena notebook has no round-trip
term), the note says so. docs/training.md#recipe-presets lists them, generated from here."""

from __future__ import annotations

from dataclasses import dataclass, field

from training.config.schema import ConfigError
from training.config.terms import LOSS_TERMS


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str  # where the numbers come from
    summary: str  # one line: what it does
    values: dict = field(default_factory=dict)  # the config keys it sets
    note: str = ""  # where it differs from its source


RECIPES = {recipe.name: recipe for recipe in (
    Recipe(
        "seraena-notebook",
        "madebyollin/seraena, TAEHV_Training_Example.ipynb",
        "Seraena from step 0 beside plain MSE terms; AdamW 3e-4, betas (0.9, 0.95)",
        dict(encoder_weight=1.0, decoder_weight=1.0, reconstruction_weight=1.0, perceptual_weight=0.0,
             seraena_weight=1.0, temporal_weight=0.0, pixel_loss="mse", learning_rate=3e-4, adam_beta1=0.9,
             adam_beta2=0.95, seraena_schedule=(), discriminator_start_step=-1),
        note="the notebook trains the decoder on the reference latents only; the round trip "
             "(reconstruction_weight) is kept so that the recipe also trains in autoencoder mode",
    ),
    Recipe(
        "vidtok",
        "VidTok (Tang et al. 2024, microsoft/VidTok configs): disc_start 20001, disc_weight 0.2, "
        "perceptual_weight 1.0, adaptive weight",
        "L1 + LPIPS 1.0 from step 0; the adversarial term (weight 0.2, adaptive) from step 20,000",
        dict(reconstruction_weight=1.0, decoder_weight=1.0, pixel_loss="l1", perceptual_weight=1.0,
             seraena_weight=0.2, seraena_schedule=(20_000, 0), discriminator_start_step=-1,
             adaptive_adversarial=True, adaptive_weight_max=1e4, temporal_weight=0.0),
        note="VidTok's discriminator is a PatchGAN; ours is Seraena's, at VidTok's weight and start",
    ),
    Recipe(
        "opensora2",
        "Open-Sora 2.0 (hpcai-tech, 2025) video DC-AE: LPIPS 0.5, a discriminator added near convergence at 0.05",
        "MSE + LPIPS 0.5; the adversarial term at 0.05, ramped in over 2,000 steps from step 60,000 after a "
        "5,000-step critic warm-up",
        dict(reconstruction_weight=1.0, decoder_weight=1.0, pixel_loss="mse", perceptual_weight=0.5,
             seraena_weight=0.05, seraena_schedule=(60_000, 2_000), discriminator_start_step=55_000,
             adaptive_adversarial=False, temporal_weight=0.0),
        note="Open-Sora's discriminator is a hinge-loss 3D one; ours is Seraena's. 'Near convergence' is "
             "given here as step 60,000; move seraena_schedule and discriminator_start_step to your run's length",
    ),
    Recipe(
        "no-gan",
        "Turbo-VAED (2025) default: L1 + LPIPS 1.0, no adversarial term",
        "L1 + LPIPS 1.0, no discriminator",
        dict(reconstruction_weight=1.0, decoder_weight=1.0, pixel_loss="l1", perceptual_weight=1.0,
             seraena_weight=0.0, seraena_schedule=(), temporal_weight=0.0),
    ),
)}


def recipe_values(name: str, distill: bool = True) -> dict:
    """The config delta of recipe `name` ("" = none). In autoencoder mode (distill=False) the weights
    of the terms that need reference latents are left as the profile has them (0)."""
    if not name:
        return {}
    if name not in RECIPES:
        raise ConfigError(f"recipe={name!r} is not a recipe; recipes: {', '.join(RECIPES)} (training/config/recipes.py)")
    reference_only = set() if distill else {term.weight_key for term in LOSS_TERMS if term.needs_reference}
    return {key: value for key, value in RECIPES[name].values.items() if key not in reference_only}
