"""`python -m training.plan PROFILE [...]`: the launcher's config step and the dry run (training/plan/cli.py)."""

from training.base.fast_exit import exit_now
from training.plan.cli import main

exit_now(main())
