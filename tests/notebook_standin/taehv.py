"""Stand-in for madebyollin/taehv's taehv.py in tests (scripts/notebook_recipe.py imports it by path):
our TAEHV in the notebook's taew2_1 layout, under upstream's constructor. Tests of the notebook
benchmarks' plumbing run with it where no checkout of upstream is at hand; the comparison itself
needs upstream's file."""

from models.taehv import TAEHV as OurTAEHV


class TAEHV(OurTAEHV):
    def __init__(self, checkpoint_path=None):
        assert checkpoint_path is None, "the stand-in builds random weights only"
        super().__init__("taew2_1")
