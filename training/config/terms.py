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

    @property
    def schedule_key(self) -> str:
        """Its TrainConfig schedule, (start_step, ramp_steps) or (): <term>_schedule."""
        return self.weight_key.replace("_weight", "_schedule")


# in the order the step adds them (the floating-point sum of the total)
LOSS_TERMS = (
    LossTerm("encoder", "encoder_weight", LATENTS, needs_reference=True),
    LossTerm("decoder", "decoder_weight", REFERENCE_DECODE, needs_reference=True),
    LossTerm("reconstruction", "reconstruction_weight", ROUND_TRIP),
    LossTerm("chroma", "chroma_weight", ROUND_TRIP),
    LossTerm("perceptual", "perceptual_weight", JUDGED, module="lpips"),
    LossTerm("temporal", "temporal_weight", JUDGED),
    LossTerm("seraena", "seraena_weight", JUDGED, module="seraena", across_ranks=True),
)
WEIGHT_KEYS = tuple(term.weight_key for term in LOSS_TERMS)
SCHEDULE_KEYS = tuple(term.schedule_key for term in LOSS_TERMS)
TERMS_BY_NAME = {term.name: term for term in LOSS_TERMS}


def active_terms(config, distill: bool | None = None) -> tuple[LossTerm, ...]:
    """The terms on: weight > 0, and distilling for those that need the reference (distill:
    whether reference latents are given; default config.use_ref_vae)."""
    distill = config.use_ref_vae if distill is None else distill
    return tuple(term for term in LOSS_TERMS
                 if getattr(config, term.weight_key) > 0 and (distill or not term.needs_reference))


def schedule(config, term: LossTerm) -> tuple[int, int]:
    """(start_step, ramp_steps) of a term; (0, 0) when it has none."""
    value = getattr(config, term.schedule_key)
    return (int(value[0]), int(value[1])) if value else (0, 0)


def weight_at(config, term: LossTerm, step: int) -> float:
    """The term's weight at optimizer step `step` of this stage (0-based; the schedule counts from
    the run's first stage): 0 before start_step, then rising linearly over ramp_steps (step
    start_step has 1/ramp_steps of it), then the full weight. A function of the step alone, so a
    resume, an elastic resume or the next stage continues it exactly."""
    start, ramp = schedule(config, term)
    at = config.schedule_offset + step
    full = getattr(config, term.weight_key)
    if at < start:
        return 0.0
    return full * min(1.0, (at - start + 1) / ramp) if ramp else full


def term_weights(config, step: int, distill: bool | None = None) -> dict[str, float]:
    """{name: weight at `step`} of the terms on (active_terms)."""
    return {term.name: weight_at(config, term, step) for term in active_terms(config, distill)}


def discriminator_start(config) -> int:
    """The run step from which Seraena's discriminator updates: discriminator_start_step, or with
    its term (-1)."""
    if config.discriminator_start_step >= 0:
        return config.discriminator_start_step
    return schedule(config, TERMS_BY_NAME["seraena"])[0]


def discriminator_updates(config, step: int) -> bool:
    return config.schedule_offset + step >= discriminator_start(config)


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


def student_needs(config, distill: bool | None = None, at_step: int | None = None) -> StudentNeeds:
    """What the terms on read (at_step: only those whose scheduled weight is > 0 at that step)."""
    distill = config.use_ref_vae if distill is None else distill
    read = {source(term, distill) for term in active_terms(config, distill)
            if at_step is None or weight_at(config, term, at_step) > 0}
    return StudentNeeds(LATENTS in read, ROUND_TRIP in read, REFERENCE_DECODE in read)


def needs_module(config, module: str) -> bool:
    """Whether a term on runs `module` ("lpips", "seraena")."""
    return any(term.module == module for term in active_terms(config))


def schedule_lines(config, distill: bool | None = None) -> list[str]:
    """The loss schedule as a short table (the dry run prints it): each term on, its weight, start and
    ramp in run steps, and the discriminator's start when Seraena is on."""
    lines = [f"{'term':<15}{'weight':>8}{'start':>9}{'ramp':>8}"]
    for term in active_terms(config, distill):
        start, ramp = schedule(config, term)
        notes = ["x adaptive (VQGAN ratio)"] if term.name == "seraena" and config.adaptive_adversarial else []
        if start >= config.schedule_offset + config.max_steps:
            notes.append(f"starts after this run's last step {config.schedule_offset + config.max_steps}")
        lines.append(f"{term.name:<15}{getattr(config, term.weight_key):>8g}{start:>9}{ramp:>8}"
                     + "".join(f"  {note}" for note in notes))
    if any(term.name == "seraena" for term in active_terms(config, distill)):
        lines.append(f"discriminator updates from step {discriminator_start(config)}")
    if config.schedule_offset:
        lines.append(f"steps count from the run's first stage: this stage starts at step {config.schedule_offset}")
    if config.recipe:
        lines.append(f"recipe: {config.recipe} (training/config/recipes.py)")
    return lines
