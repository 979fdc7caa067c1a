"""The loss terms as records: what each reads from the student, and what it needs. The step
(training/step/losses.py), the FLOP count (training/plan/step_flops.py), the measured step
(training/plan/memory.py), the DDP setup (training/loop/build.py) and the config rules read their
needs from here, so a new term is a record, its weight in training/config/schema.py, and its
formula in training/step/losses.py. Here, below the step, because the config rules read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

# what a term reads from the student (training/step/losses.py Student)
LATENTS = "latents"  # its encode of the video
ROUND_TRIP = "roundtrip"  # the decode of its own latents
REFERENCE_DECODE = "reference_decode"  # its decode of the reference VAE's latents
JUDGED = "judged"  # "the" decode: of the reference latents when distilling, else the round trip


@dataclass(frozen=True)
class LossTerm:
    name: str  # logged as train/<name>; training/step/losses.py computes it by this name
    weight_key: str  # its TrainConfig weight: the term is on while it is > 0
    reads: str  # LATENTS, ROUND_TRIP, REFERENCE_DECODE or JUDGED
    needs_reference: bool = False  # compares with the reference VAE's latents: on only when distilling
    module: str = ""  # the network it runs besides the student ("lpips", "seraena"): built, counted, measured when on
    across_ranks: bool = False  # its discriminator step all-reduces: added after the ranks agree (add_seraena_term)


# in the order the step adds them (the floating-point sum of the total)
LOSS_TERMS = (
    LossTerm("encoder", "encoder_weight", LATENTS, needs_reference=True),
    LossTerm("decoder", "decoder_weight", REFERENCE_DECODE, needs_reference=True),
    LossTerm("reconstruction", "reconstruction_weight", ROUND_TRIP),
    LossTerm("perceptual", "perceptual_weight", JUDGED, module="lpips"),
    LossTerm("temporal", "temporal_weight", JUDGED),
    LossTerm("seraena", "seraena_weight", JUDGED, module="seraena", across_ranks=True),
)
WEIGHT_KEYS = tuple(term.weight_key for term in LOSS_TERMS)


def active_terms(config, distill: bool | None = None) -> tuple[LossTerm, ...]:
    """The terms on: weight > 0, and distilling for those that need the reference (distill:
    whether reference latents are given; default config.use_ref_vae)."""
    distill = config.use_ref_vae if distill is None else distill
    return tuple(term for term in LOSS_TERMS
                 if getattr(config, term.weight_key) > 0 and (distill or not term.needs_reference))


def source(term: LossTerm, distill: bool) -> str:
    """The student output a term reads (JUDGED resolved)."""
    if term.reads != JUDGED:
        return term.reads
    return REFERENCE_DECODE if distill else ROUND_TRIP


@dataclass(frozen=True)
class StudentNeeds:
    """What the student computes in a step: only what the terms on read."""

    latents: bool  # its encode, as an output (the encoder term)
    roundtrip: bool
    reference_decode: bool

    @property
    def encode(self) -> bool:
        """The encoder runs (and gets gradients): for its latents or the round trip. When it does
        not while distilling, DDP must be told the encoder's parameters sit idle."""
        return self.latents or self.roundtrip


def student_needs(config, distill: bool | None = None) -> StudentNeeds:
    distill = config.use_ref_vae if distill is None else distill
    read = {source(term, distill) for term in active_terms(config, distill)}
    return StudentNeeds(LATENTS in read, ROUND_TRIP in read, REFERENCE_DECODE in read)


def needs_module(config, module: str) -> bool:
    """Whether a term on runs `module` ("lpips", "seraena")."""
    return any(term.module == module for term in active_terms(config))
