"""`python -m training.plan PROFILE [...]`: the launcher's config step and the dry run (training/plan/cli.py)."""

from training.plan.cli import main

raise SystemExit(main())
