"""Stand-in for madebyollin/seraena's seraena.py in tests (see taehv.py beside it): our Seraena
under upstream's one-call step."""

from models.seraena import Seraena as OurSeraena


class Seraena(OurSeraena):
    def step_and_make_correction_targets(self, real, fake, ctx):
        """upstream's: one discriminator step, then the corrected fakes and a dict of debug values."""
        self.discriminator_step(real, fake, ctx)
        return self.correct(real, fake, ctx), {}
